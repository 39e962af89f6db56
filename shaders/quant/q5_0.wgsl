// Decoder for Q5_0 (32 weights a block: f16 d, u32 qh, 16 bytes of low nibbles; weight i has
// its fifth bit in bit i of qh and value (q - 16) * d). GPU layout: per row, each block's qh and
// qs (5 words), then the row's f16 scales d.
const Q5_0_BODY_WORDS: u32 = 5u;

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 32u;
    let j = k % 32u;
    let body = row.first_word + block * Q5_0_BODY_WORDS;
    let qh = word(body) >> j;
    let w = body + 1u + (j % 16u) / 4u;
    let shift = (j / 16u) * 4u;
    let high_lo = ((vec4<u32>(qh) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    let high_hi = ((vec4<u32>(qh) >> vec4<u32>(4u, 5u, 6u, 7u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    let d = trailing_scale(row, Q5_0_BODY_WORDS, block);
    let lo = vec4<f32>(byte_fields(word(w), shift, 0xfu) | high_lo) - 16.0;
    let hi = vec4<f32>(byte_fields(word(w + 1u), shift, 0xfu) | high_hi) - 16.0;
    return Weights8(lo * d, hi * d);
}
