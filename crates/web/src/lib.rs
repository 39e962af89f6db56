//! flint in the browser: JS bindings over flint-core, built with wasm-bindgen.
//!
//! Everything here is async on the JS side and never blocks the page: GPU work is awaited
//! through the browser's WebGPU callbacks, and the engine's step loop runs as a task of the
//! page's (or the worker's) event loop (`wasm_bindgen_futures::spawn_local`). The classes here
//! speak JSON text; the npm package's wrapper (`js/flint.js`) gives them the JS API of
//! ARCHITECTURE.md ("The web package"): `Engine.load(url | ArrayBuffer | Blob)` (read piece by
//! piece, never whole: `source.rs`), `generate`, `stream`, `chat.completions.create`,
//! `AbortSignal`s.

mod engine;
mod error;
mod openai;
mod params;
mod source;

use flint_core::gpu::{GpuContext, GpuOptions};
use wasm_bindgen::prelude::*;

pub use engine::{Engine, OutputStream};
pub use error::{Error, Result};
pub use source::ModelSource;

/// Opens the browser's WebGPU adapter and returns a JSON string describing it (adapter,
/// backend, optional features, limits) and its memory bandwidth as flint's probe kernels
/// measure it on a buffer of `probe_bytes` (0 skips the measurement).
#[wasm_bindgen(js_name = gpuInfo)]
pub async fn gpu_info(probe_bytes: u32) -> Result<String, JsError> {
    let ctx = GpuContext::new(&GpuOptions::default()).await.map_err(Error::from)?;
    let bandwidth = if probe_bytes == 0 {
        None
    } else {
        let now_s = || js_sys::Date::now() / 1000.0;
        Some(
            flint_core::kernels::copy::measure_bandwidth(&ctx, probe_bytes.into(), 5, &now_s)
                .await
                .map_err(Error::from)?,
        )
    };
    let report = serde_json::json!({ "device": ctx.describe(), "bandwidth": bandwidth });
    Ok(report.to_string())
}

/// Reads a GGUF file's header from `source` (see [`ModelSource`]) and returns a JSON string of
/// its summary: architecture, hyper-parameters, tokenizer, tensors by type, size. A malformed
/// file gives an `Error` whose message says what is wrong.
#[wasm_bindgen(js_name = inspectGguf)]
pub async fn inspect_gguf(source: ModelSource) -> Result<String, JsError> {
    let summary = source.open().await?.summary().map_err(Error::from)?;
    Ok(serde_json::to_string(&summary).map_err(Error::from)?)
}

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

/// Writes panics to the console: a panic is a bug, and in wasm32 it aborts the module, so its
/// message is the only trace left.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| console_error(&format!("flint panicked: {info}"))));
    });
}
