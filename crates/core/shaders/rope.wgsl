// Rotary position embedding, in place, as llama.cpp applies it.
//
// Layout: `x` holds rows of HEAD_DIM f32, one row per (token, head), token-major: the row
// index is token * params.heads + head. `positions[token]` is the token's position.
// Pair p (0 <= p < ROT_PAIRS = n_rot / 2) rotates dims (2p, 2p + 1) of its row, or with NEOX
// dims (p, p + ROT_PAIRS), by the angle position * theta_p; dims from 2 * ROT_PAIRS on are
// left as they are.
// Composed after rope_common.wgsl (the rotation, and what `turns` holds).
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

fn pair_turn(pair: u32) -> u32 {
    return turns[pair];
}

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

    let cs = rotation(positions[token], pair);
#if NEOX
    let a = row * HEAD_DIM + pair;
    let b = a + ROT_PAIRS;
#else
    let a = row * HEAD_DIM + 2u * pair;
    let b = a + 1u;
#endif
    let rotated = rotate(vec2<f32>(x[a], x[b]), cs);
    x[a] = rotated.x;
    x[b] = rotated.y;
}
