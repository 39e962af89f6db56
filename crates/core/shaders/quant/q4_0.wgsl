// Decoder for Q4_0 (32 weights a block: weight j = ((qs[j] & 15) - 8) * d and weight j + 16 =
// ((qs[j] >> 4) - 8) * d). GPU layout: per row, each block's 16 bytes of qs (4 words), then the
// row's f16 scales d.
const Q4_0_BODY_WORDS: u32 = 4u;

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 32u;
    let j = k % 32u;
    // Weights 0..16 are the low nibbles of bytes 0..16, weights 16..32 the high nibbles.
    let w = row.first_word + block * Q4_0_BODY_WORDS + (j % 16u) / 4u;
    let shift = (j / 16u) * 4u;
    let d = trailing_scale(row, Q4_0_BODY_WORDS, block);
    let lo = vec4<f32>(byte_fields(word(w), shift, 0xfu)) - 8.0;
    let hi = vec4<f32>(byte_fields(word(w + 1u), shift, 0xfu)) - 8.0;
    return Weights8(lo * d, hi * d);
}

// One block: its scale and its 16 bytes of nibbles.
struct Block32 {
    d: f32,
    qs: vec4<u32>,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    let block = k / 32u;
    let qs = words4(row.first_word + block * Q4_0_BODY_WORDS);
    return Block32(trailing_scale(row, Q4_0_BODY_WORDS, block), qs);
}

// Weights 8i .. 8i + 8 are the low (i < 2) or high nibbles of bytes 8(i % 2) .. 8(i % 2) + 8.
fn unpack8(block: Block32, i: u32) -> Weights8 {
    let at = 2u * (i % 2u);
    let shift = (i / 2u) * 4u;
    let lo = vec4<f32>(byte_fields(block.qs[at], shift, 0xfu)) - 8.0;
    let hi = vec4<f32>(byte_fields(block.qs[at + 1u], shift, 0xfu)) - 8.0;
    return Weights8(lo * block.d, hi * block.d);
}
