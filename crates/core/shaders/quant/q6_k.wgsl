// Decoder for Q6_K (256 weights a block: 128 bytes ql, 64 bytes qh, 16 signed scales, f16 d).
// In half h (128 weights), weight l + 32i (l < 32, i < 4) is
//     ((ql[64h + l + 32(i % 2)] >> 4(i / 2)) & 15 | ((qh[32h + l] >> 2i) & 3) << 4) - 32
// times d * scales[8h + l / 16 + 2i]. GPU layout: per row, each block without d (208 bytes,
// 52 words: ql at word 0, qh at 32, scales at 48), then the row's f16 scales d. The 32 weights
// of one (h, i) take 32 bytes of ql and 32 of qh at 16-byte boundaries (four vec4 loads), two
// scale bytes and d.
const Q6_K_BODY_WORDS: u32 = 52u;

// Eight weights from two words of ql (their nibbles at `low_shift`), the two matching words of
// qh (their 2-bit fields at `high_shift`) and the scale d.
fn q6_k_weights8(ql0: u32, ql1: u32, qh0: u32, qh1: u32, low_shift: u32, high_shift: u32, d: f32) -> Weights8 {
    let lo = byte_fields(ql0, low_shift, 0xfu) | (byte_fields(qh0, high_shift, 3u) << vec4<u32>(4u));
    let hi = byte_fields(ql1, low_shift, 0xfu) | (byte_fields(qh1, high_shift, 3u) << vec4<u32>(4u));
    return Weights8(d * (vec4<f32>(lo) - 32.0), d * (vec4<f32>(hi) - 32.0));
}

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 256u;
    let body = row.first_word + block * Q6_K_BODY_WORDS;
    let e = k % 256u;
    let h = e / 128u;
    let i = (e % 128u) / 32u;
    let l = e % 32u;
    let ql = body + (64u * h + 32u * (i % 2u) + l) / 4u;
    let qh = body + 32u + (32u * h + l) / 4u;
    let scale_index = 8u * h + l / 16u + 2u * i;
    let scale_byte = (word(body + 48u + scale_index / 4u) >> ((scale_index % 4u) * 8u)) & 0xffu;
    let scale = f32(bitcast<i32>(scale_byte << 24u) >> 24u);
    let d = trailing_scale(row, Q6_K_BODY_WORDS, block) * scale;
    return q6_k_weights8(word(ql), word(ql + 1u), word(qh), word(qh + 1u), (i / 2u) * 4u, 2u * i, d);
}

// The 32 weights l + 32i of half h of a block (l < 32): their low and high bits, the scale of
// l < 16 and of l >= 16, and where their bits sit in each byte.
struct Block32 {
    ql_first: vec4<u32>,
    ql_last: vec4<u32>,
    qh_first: vec4<u32>,
    qh_last: vec4<u32>,
    d_first: f32,
    d_last: f32,
    low_shift: u32,
    high_shift: u32,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    let block = k / 256u;
    let body = row.first_word + block * Q6_K_BODY_WORDS;
    let h = (k % 256u) / 128u;
    let i = (k % 128u) / 32u;
    let ql = body + 16u * h + 8u * (i % 2u);
    let qh = body + 32u + 8u * h;
    // Scale bytes 8h + 2i and 8h + 2i + 1: one word, an even byte offset.
    let scale_index = 8u * h + 2u * i;
    let scales = word(body + 48u + scale_index / 4u) >> ((scale_index % 4u) * 8u);
    let signed = bitcast<vec2<i32>>(vec2<u32>(scales << 24u, scales << 16u)) >> vec2<u32>(24u);
    let d = trailing_scale(row, Q6_K_BODY_WORDS, block) * vec2<f32>(signed);
    return Block32(words4(ql), words4(ql + 4u), words4(qh), words4(qh + 4u), d.x, d.y, (i / 2u) * 4u, 2u * i);
}

// Weights l = 8s .. 8s + 8: words 2s and 2s + 1 of the 8 of ql and of qh.
fn unpack8(block: Block32, s: u32) -> Weights8 {
    let ql = select(block.ql_last, block.ql_first, s < 2u);
    let qh = select(block.qh_last, block.qh_first, s < 2u);
    let d = select(block.d_last, block.d_first, s < 2u);
    let at = 2u * (s % 2u);
    return q6_k_weights8(ql[at], ql[at + 1u], qh[at], qh[at + 1u], block.low_shift, block.high_shift, d);
}
