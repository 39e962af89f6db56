// Decoder for BF16 weights: two per word, each the high 16 bits of an f32.
fn bf16_pair(word: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(word << 16u, word & 0xffff0000u));
}

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let w = row.first_word + k / 2u;
    let lo = vec4<f32>(bf16_pair(weights[w]), bf16_pair(weights[w + 1u]));
    let hi = vec4<f32>(bf16_pair(weights[w + 2u]), bf16_pair(weights[w + 3u]));
    return Weights8(lo, hi);
}
