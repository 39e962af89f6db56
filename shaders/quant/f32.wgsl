// Decoder for F32 weights: a row is `cols` little-endian f32 words.
fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let w = row.first_word + k;
    let lo = vec4<u32>(weights[w], weights[w + 1u], weights[w + 2u], weights[w + 3u]);
    let hi = vec4<u32>(weights[w + 4u], weights[w + 5u], weights[w + 6u], weights[w + 7u]);
    return Weights8(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi));
}
