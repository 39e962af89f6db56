// Decoder for Q5_0 (32 weights a block: f16 d, u32 qh, 16 bytes of low nibbles; weight i has
// its fifth bit in bit i of qh and value (q - 16) * d; weight j < 16 has its low nibble in the
// low half of byte j, weight j + 16 in the high half). GPU layout: per row, each block's 16
// bytes of low nibbles (one vec4), then the row's qh words, then its f16 scales d.
const Q5_0_BODY_WORDS: u32 = 4u;

// Word `block` of the row's qh array.
fn q5_0_high_bits(row: WeightRow, block: u32) -> u32 {
    return word(row.first_word + row.blocks * Q5_0_BODY_WORDS + block);
}

// The f16 scale of `block`, from the array after the qh words.
fn q5_0_scale(row: WeightRow, block: u32) -> f32 {
    return trailing_scale(row, Q5_0_BODY_WORDS + 1u, block);
}

// The fifth bits of weights j .. j + 8 (from qh shifted down by j), as bit 4 of two vec4s.
fn q5_0_fifth_bits(qh: u32) -> Weights8 {
    let lo = ((vec4<u32>(qh) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    let hi = ((vec4<u32>(qh) >> vec4<u32>(4u, 5u, 6u, 7u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return Weights8(vec4<f32>(lo), vec4<f32>(hi));
}

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 32u;
    let j = k % 32u;
    let w = row.first_word + block * Q5_0_BODY_WORDS + (j % 16u) / 4u;
    let shift = (j / 16u) * 4u;
    let high = q5_0_fifth_bits(q5_0_high_bits(row, block) >> j);
    let d = q5_0_scale(row, block);
    let lo = vec4<f32>(byte_fields(word(w), shift, 0xfu)) + high.lo - 16.0;
    let hi = vec4<f32>(byte_fields(word(w + 1u), shift, 0xfu)) + high.hi - 16.0;
    return Weights8(lo * d, hi * d);
}

// One block: its scale, its fifth bits and its 16 bytes of low nibbles.
struct Block32 {
    d: f32,
    qh: u32,
    qs: vec4<u32>,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    let block = k / 32u;
    let qs = words4(row.first_word + block * Q5_0_BODY_WORDS);
    return Block32(q5_0_scale(row, block), q5_0_high_bits(row, block), qs);
}

// Weights 8i .. 8i + 8: the low (i < 2) or high nibbles of bytes 8(i % 2) .. 8(i % 2) + 8.
fn unpack8(block: Block32, i: u32) -> Weights8 {
    let at = 2u * (i % 2u);
    let shift = (i / 2u) * 4u;
    let high = q5_0_fifth_bits(block.qh >> (8u * i));
    let lo = vec4<f32>(byte_fields(block.qs[at], shift, 0xfu)) + high.lo - 16.0;
    let hi = vec4<f32>(byte_fields(block.qs[at + 1u], shift, 0xfu)) + high.hi - 16.0;
    return Weights8(lo * block.d, hi * block.d);
}
