// Decoder for Q5_1 (32 weights a block: f16 d, f16 m, u32 qh, 16 bytes of low nibbles; weight i
// has its fifth bit in bit i of qh and value q * d + m). GGUF blocks of 6 words, unchanged.
const Q5_1_BLOCK_WORDS: u32 = 6u;

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = row.first_word + (k / 32u) * Q5_1_BLOCK_WORDS;
    let j = k % 32u;
    let dm = unpack2x16float(word(block));
    let qh = word(block + 1u) >> j;
    let w = block + 2u + (j % 16u) / 4u;
    let shift = (j / 16u) * 4u;
    let high_lo = ((vec4<u32>(qh) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    let high_hi = ((vec4<u32>(qh) >> vec4<u32>(4u, 5u, 6u, 7u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    let lo = vec4<f32>(byte_fields(word(w), shift, 0xfu) | high_lo);
    let hi = vec4<f32>(byte_fields(word(w + 1u), shift, 0xfu) | high_hi);
    return Weights8(lo * dm.x + dm.y, hi * dm.x + dm.y);
}
