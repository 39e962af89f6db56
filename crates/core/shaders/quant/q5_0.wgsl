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

// Eight weights from two words of low nibbles (the halves at `shift`), the fifth bits `qh`
// shifted down to the first of them, and the scale d.
fn q5_0_weights8(first: u32, second: u32, shift: u32, qh: u32, d: f32) -> Weights8 {
    // Bit 4 of each weight: bits 0..8 of qh.
    let high_lo = vec4<f32>(((vec4<u32>(qh) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) << vec4<u32>(4u));
    let high_hi = vec4<f32>(((vec4<u32>(qh) >> vec4<u32>(4u, 5u, 6u, 7u)) & vec4<u32>(1u)) << vec4<u32>(4u));
    let lo = vec4<f32>(byte_fields(first, shift, 0xfu)) + high_lo - 16.0;
    let hi = vec4<f32>(byte_fields(second, shift, 0xfu)) + high_hi - 16.0;
    return Weights8(lo * d, hi * d);
}

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 32u;
    let j = k % 32u;
    let w = row.first_word + block * Q5_0_BODY_WORDS + (j % 16u) / 4u;
    let shift = (j / 16u) * 4u;
    return q5_0_weights8(word(w), word(w + 1u), shift, q5_0_high_bits(row, block) >> j, q5_0_scale(row, block));
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
    return q5_0_weights8(block.qs[at], block.qs[at + 1u], shift, block.qh >> (8u * i), block.d);
}
