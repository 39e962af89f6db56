//! flint in the browser: JS bindings over flint-core, built with wasm-bindgen.
//!
//! Everything here is async on the JS side and never blocks the page: GPU work is awaited
//! through the browser's WebGPU callbacks. The npm package around these bindings comes with the
//! web issue; today they expose what the foundation has: the device and GGUF inspection.

use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use wasm_bindgen::prelude::*;

/// Opens the browser's WebGPU adapter and returns a JSON string describing it (adapter,
/// backend, optional features, limits) and its memory bandwidth as flint's probe kernels
/// measure it on a buffer of `probe_bytes` (0 skips the measurement).
#[wasm_bindgen(js_name = gpuInfo)]
pub async fn gpu_info(probe_bytes: u32) -> Result<String, JsError> {
    let ctx = GpuContext::new(&GpuOptions::default()).await.map_err(to_js)?;
    let bandwidth = if probe_bytes == 0 {
        None
    } else {
        let now_s = || js_sys::Date::now() / 1000.0;
        Some(
            flint_core::kernels::copy::measure_bandwidth(&ctx, probe_bytes.into(), 5, &now_s)
                .await
                .map_err(to_js)?,
        )
    };
    let report = serde_json::json!({ "device": ctx.describe(), "bandwidth": bandwidth });
    Ok(report.to_string())
}

/// Parses a GGUF file's bytes (e.g. `new Uint8Array(await file.arrayBuffer())`) and returns a
/// JSON string of its summary: architecture, hyper-parameters, tokenizer, tensors by type, size.
/// A malformed file gives an `Error` whose message says what is wrong.
#[wasm_bindgen(js_name = inspectGguf)]
pub fn inspect_gguf(bytes: Vec<u8>) -> Result<String, JsError> {
    let summary = GgufFile::from_bytes(bytes).and_then(|file| file.summary()).map_err(to_js)?;
    serde_json::to_string(&summary).map_err(|e| JsError::new(&e.to_string()))
}

fn to_js(error: flint_core::Error) -> JsError {
    JsError::new(&error.to_string())
}
