// Decoder for Q8_0 (32 weights a block: f16 d, 32 signed bytes; weight j = qs[j] * d).
// GPU layout: per row, each block's 32 bytes (8 words), then the row's f16 scales d.
const Q8_0_BODY_WORDS: u32 = 8u;

// The four signed bytes of a word, sign-extended by shifting each to the top and back.
fn signed_bytes(packed: u32) -> vec4<f32> {
    let top = bitcast<vec4<i32>>(vec4<u32>(packed) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(top >> vec4<u32>(24u));
}

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let block = k / 32u;
    let w = row.first_word + block * Q8_0_BODY_WORDS + (k % 32u) / 4u;
    let d = trailing_scale(row, Q8_0_BODY_WORDS, block);
    return Weights8(signed_bytes(word(w)) * d, signed_bytes(word(w + 1u)) * d);
}

// One block: its scale and its 32 bytes.
struct Block32 {
    d: f32,
    first: vec4<u32>,
    last: vec4<u32>,
}

fn load32(row: WeightRow, k: u32) -> Block32 {
    let block = k / 32u;
    let w = row.first_word + block * Q8_0_BODY_WORDS;
    return Block32(trailing_scale(row, Q8_0_BODY_WORDS, block), words4(w), words4(w + 4u));
}

fn unpack8(block: Block32, i: u32) -> Weights8 {
    let words = select(block.last, block.first, i < 2u);
    let at = 2u * (i % 2u);
    return Weights8(signed_bytes(words[at]) * block.d, signed_bytes(words[at + 1u]) * block.d);
}
