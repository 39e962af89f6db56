// Decoder for Q5_K (256 weights a block, GGUF layout unchanged, 44 words: f16 d and dmin, 12
// bytes of 6-bit sub-block scales and mins, 32 bytes qh, 128 bytes of low nibbles). As Q4_K,
// with the fifth bit of weight l of sub-block s in bit s of qh[l].
const Q5_K_BLOCK_WORDS: u32 = 44u;

// k_scale_min comes from k_scales.wgsl.
fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = row.first_word + (k / 256u) * Q5_K_BLOCK_WORDS;
    let sub = (k % 256u) / 32u;
    let l = k % 32u;
    let header = words4(block);
    let d_dmin = unpack2x16float(header.x);
    let scale_min = k_scale_min(header, sub);
    let d = d_dmin.x * scale_min.x;
    let m = d_dmin.y * scale_min.y;
    let h = block + 4u + l / 4u;
    let w = block + 12u + (sub / 2u) * 8u + l / 4u;
    let shift = (sub % 2u) * 4u;
    let lo = vec4<f32>(byte_fields(word(w), shift, 0xfu) | (byte_fields(word(h), sub, 1u) << vec4<u32>(4u)));
    let hi = vec4<f32>(byte_fields(word(w + 1u), shift, 0xfu) | (byte_fields(word(h + 1u), sub, 1u) << vec4<u32>(4u)));
    return Weights8(d * lo - m, d * hi - m);
}
