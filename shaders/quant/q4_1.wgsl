// Decoder for Q4_1 (32 weights a block: f16 d, f16 m, 16 bytes of nibbles; weight j =
// (qs[j] & 15) * d + m and weight j + 16 = (qs[j] >> 4) * d + m). GGUF blocks of 5 words, unchanged.
const Q4_1_BLOCK_WORDS: u32 = 5u;

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = row.first_word + (k / 32u) * Q4_1_BLOCK_WORDS;
    let j = k % 32u;
    let dm = unpack2x16float(weights[block]);
    let w = block + 1u + (j % 16u) / 4u;
    let shift = (j / 16u) * 4u;
    let lo = vec4<f32>(byte_fields(weights[w], shift, 0xfu));
    let hi = vec4<f32>(byte_fields(weights[w + 1u], shift, 0xfu));
    return Weights8(lo * dm.x + dm.y, hi * dm.x + dm.y);
}
