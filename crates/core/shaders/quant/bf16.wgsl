// Decoder for BF16 weights: two per word, each the high 16 bits of an f32; 8 weights are one
// vec4 load.
fn bf16_pair(packed: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(packed << 16u, packed & 0xffff0000u));
}

fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let w = words4(row.first_word + k / 2u);
    return Weights8(vec4<f32>(bf16_pair(w.x), bf16_pair(w.y)), vec4<f32>(bf16_pair(w.z), bf16_pair(w.w)));
}
