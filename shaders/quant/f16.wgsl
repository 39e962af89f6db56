// Decoder for F16 weights: two halves per word, the lower element in the low half.
// unpack2x16float needs no shader-f16 feature.
fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let w = row.first_word + k / 2u;
    let lo = vec4<f32>(unpack2x16float(weights[w]), unpack2x16float(weights[w + 1u]));
    let hi = vec4<f32>(unpack2x16float(weights[w + 2u]), unpack2x16float(weights[w + 3u]));
    return Weights8(lo, hi);
}
