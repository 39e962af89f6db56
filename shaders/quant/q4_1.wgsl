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

// One block: its scale and offset, and its 16 bytes of nibbles.
struct Block32 {
    dm: vec2<f32>,
    qs: vec4<u32>,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    let block = row.first_word + (k / 32u) * Q4_1_BLOCK_WORDS;
    let qs = vec4<u32>(weights[block + 1u], weights[block + 2u], weights[block + 3u], weights[block + 4u]);
    return Block32(unpack2x16float(weights[block]), qs);
}

// Weights 8i .. 8i + 8 are the low (i < 2) or high nibbles of bytes 8(i % 2) .. 8(i % 2) + 8.
fn unpack8(block: Block32, i: u32) -> Weights8 {
    let word = 2u * (i % 2u);
    let shift = (i / 2u) * 4u;
    let lo = vec4<f32>(byte_fields(block.qs[word], shift, 0xfu));
    let hi = vec4<f32>(byte_fields(block.qs[word + 1u], shift, 0xfu));
    return Weights8(lo * block.dm.x + block.dm.y, hi * block.dm.x + block.dm.y);
}
