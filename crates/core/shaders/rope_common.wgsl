// The rotation of the rotary position embedding, shared by rope.wgsl, rope_kv.wgsl and
// attention_decode.wgsl (each defines the constants ROT_PAIRS, HEAD_DIM and NEOX, and
// `fn pair_turn(pair: u32) -> u32`, which reads the pair's turn from wherever it keeps them).
//
// `pair_turn(p)` is theta_p / 2π as a 0.32 fixed-point fraction (the launcher computes it in
// f64), so position * pair_turn(p) in wrapping u32 arithmetic is exactly the fraction of a turn
// that the rotation makes, up to position * 2^-33 turns: the angle stays accurate at large
// positions, and sin and cos only ever see arguments in [-π, π).

// 2π / 2^32: radians per unit of the fixed-point turn.
const RADIANS_PER_STEP: f32 = 1.4629180792671596e-9;

// (cos, sin) of the angle by which pair `pair` turns at `position`.
fn rotation(position: u32, pair: u32) -> vec2<f32> {
    // Read as signed, the fraction of a turn lies in [-1/2, 1/2).
    let turn = bitcast<i32>(position * pair_turn(pair));
    let angle = f32(turn) * RADIANS_PER_STEP;
    return vec2<f32>(cos(angle), sin(angle));
}

// The pair (x0, x1) rotated by the angle whose (cos, sin) is `cs`.
fn rotate(x: vec2<f32>, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x);
}
