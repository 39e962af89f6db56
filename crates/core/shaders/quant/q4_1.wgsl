// Decoder for Q4_1 (32 weights a block: f16 d, f16 m, 16 bytes of nibbles; weight j =
// (qs[j] & 15) * d + m and weight j + 16 = (qs[j] >> 4) * d + m). GPU layout: per row, each
// block's 16 bytes of qs (4 words, one vec4), then the row's (d, m) pairs, one word each.
const Q4_1_BODY_WORDS: u32 = 4u;

// (d, m) of block `block` of the row.
fn q4_1_scale_offset(row: WeightRow, block: u32) -> vec2<f32> {
    return unpack2x16float(word(row.first_word + row.blocks * Q4_1_BODY_WORDS + block));
}

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 32u;
    let j = k % 32u;
    let dm = q4_1_scale_offset(row, block);
    let w = row.first_word + block * Q4_1_BODY_WORDS + (j % 16u) / 4u;
    let shift = (j / 16u) * 4u;
    let lo = vec4<f32>(byte_fields(word(w), shift, 0xfu));
    let hi = vec4<f32>(byte_fields(word(w + 1u), shift, 0xfu));
    return Weights8(lo * dm.x + dm.y, hi * dm.x + dm.y);
}

// One block: its scale and offset, and its 16 bytes of nibbles.
struct Block32 {
    dm: vec2<f32>,
    qs: vec4<u32>,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    let block = k / 32u;
    return Block32(q4_1_scale_offset(row, block), words4(row.first_word + block * Q4_1_BODY_WORDS));
}

// Weights 8i .. 8i + 8 are the low (i < 2) or high nibbles of bytes 8(i % 2) .. 8(i % 2) + 8.
fn unpack8(block: Block32, i: u32) -> Weights8 {
    let at = 2u * (i % 2u);
    let shift = (i / 2u) * 4u;
    let lo = vec4<f32>(byte_fields(block.qs[at], shift, 0xfu));
    let hi = vec4<f32>(byte_fields(block.qs[at + 1u], shift, 0xfu));
    return Weights8(lo * block.dm.x + block.dm.y, hi * block.dm.x + block.dm.y);
}
