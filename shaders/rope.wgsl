// Rotary position embedding, in place, as llama.cpp applies it.
//
// Layout: `x` holds rows of HEAD_DIM f32, one row per (token, head), token-major: the row
// index is token * params.heads + head. `positions[token]` is the token's position.
// Pair p (0 <= p < ROT_PAIRS = n_rot / 2) rotates dims (2p, 2p + 1) of its row, or with NEOX
// dims (p, p + ROT_PAIRS), by the angle position * theta_p; dims from 2 * ROT_PAIRS on are
// left as they are.
// `turns[p]` is theta_p / 2π as a 0.32 fixed-point fraction (the launcher computes it in
// f64), so position * turns[p] in wrapping u32 arithmetic is exactly the fraction of a turn
// that the rotation makes, up to position * 2^-33 turns: the angle stays accurate at large
// positions, and sin and cos only ever see arguments in [-π, π).
// Workgroup: WG_SIZE invocations, one pair of one row each; the grid may be 2-D
// (index = wg.x + wg.y * num_workgroups.x) and indices past params.pairs do nothing.
// Bounds: rows * ROT_PAIRS < 2^32.

struct Params {
    pairs: u32,
    heads: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> turns: array<u32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

// 2π / 2^32: radians per unit of the fixed-point turn.
const RADIANS_PER_STEP: f32 = 1.4629180792671596e-9;

@compute @workgroup_size(WG_SIZE)
fn rope(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = (wg.x + wg.y * groups.x) * WG_SIZE + lane;
    if i >= params.pairs {
        return;
    }
    // ROT_PAIRS and HEAD_DIM are constants, so these divisions compile to multiplications.
    let row = i / ROT_PAIRS;
    let pair = i % ROT_PAIRS;
    let token = row / params.heads;

    // Read as signed, the fraction of a turn lies in [-1/2, 1/2).
    let turn = bitcast<i32>(positions[token] * turns[pair]);
    let angle = f32(turn) * RADIANS_PER_STEP;
    let c = cos(angle);
    let s = sin(angle);

#if NEOX
    let a = row * HEAD_DIM + pair;
    let b = a + ROT_PAIRS;
#else
    let a = row * HEAD_DIM + 2u * pair;
    let b = a + 1u;
#endif
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
