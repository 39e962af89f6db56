// Decoder for F32 weights: a row is `cols` little-endian f32 words (k and the row's first word
// are multiples of 4, so 8 weights are two vec4 loads).
fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let w = row.first_word + k;
    return Weights8(bitcast<vec4<f32>>(words4(w)), bitcast<vec4<f32>>(words4(w + 4u)));
}
