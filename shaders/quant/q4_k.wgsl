// Decoder for Q4_K (256 weights a block, GGUF layout unchanged, 36 words: f16 d and dmin, 12
// bytes of 6-bit sub-block scales and mins, 128 bytes of nibbles). Sub-block s (32 weights) has
// weight = d * scale_s * q - dmin * min_s; sub-blocks 2p and 2p + 1 share bytes 32p .. 32p + 32
// of qs, low nibbles then high nibbles.
const Q4_K_BLOCK_WORDS: u32 = 36u;

// k_scale_min comes from k_scales.wgsl.
fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = row.first_word + (k / 256u) * Q4_K_BLOCK_WORDS;
    let sub = (k % 256u) / 32u;
    let d_dmin = unpack2x16float(weights[block]);
    let scale_min = k_scale_min(block, sub);
    let d = d_dmin.x * scale_min.x;
    let m = d_dmin.y * scale_min.y;
    let w = block + 4u + (sub / 2u) * 8u + (k % 32u) / 4u;
    let shift = (sub % 2u) * 4u;
    let lo = vec4<f32>(byte_fields(weights[w], shift, 0xfu));
    let hi = vec4<f32>(byte_fields(weights[w + 1u], shift, 0xfu));
    return Weights8(d * lo - m, d * hi - m);
}
