// Decoder for F16 weights: two halves per word, the lower element in the low half; 8 weights
// are one vec4 load. unpack2x16float needs no shader-f16 feature.
fn decode8(row: WeightRow, k: u32) -> Weights8 {
    let w = words4(row.first_word + k / 2u);
    let lo = vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
    let hi = vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
    return Weights8(lo, hi);
}
