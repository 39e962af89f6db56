//! CPU dequantization of GGML blocks (the reference the GPU kernels are tested against).

use crate::quant::QuantType;

/// Dequantizes one row: `bytes` holds whole blocks of `quant`, `out` receives their weights.
///
/// # Panics
/// If `bytes` is not `quant.row_bytes(out.len())` long.
pub fn dequantize_row(quant: QuantType, bytes: &[u8], out: &mut [f32]) {
    let _ = (quant, bytes, out);
    todo!("helper A")
}
