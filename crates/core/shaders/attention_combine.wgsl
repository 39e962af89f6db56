// The second pass of decode attention split over the keys (attention_decode.wgsl, SPLIT): for
// each (sequence, query head, vec4 of the head), the splits' partial results are rescaled to
// their common maximum m and summed: out = sum_s exp(m_s - m) acc_s / sum_s exp(m_s - m) sum_s.
// A split that saw no keys has m_s = NO_MAX and sum 0, so it adds nothing; a row that saw no keys
// at all is written as zeros, as the single-pass kernel writes it.
//
// Layout: partials as attention_decode.wgsl's SPLIT writes them (accumulators [groups, splits,
// GROUP_HEADS, HEAD_VEC4S] vec4s, then a vec4 (maximum, sum, 0, 0) per (group, split, head)),
// where group = (seq * n_kv_heads + kv head) * chunks + chunk of GROUP_HEADS query heads;
// out [n_seqs, n_heads, HEAD_DIM] f32. One invocation per output vec4.
// Defines: HEAD_DIM, GROUP_HEADS, WG.

struct CombineParams {
    n_seqs: u32,
    n_heads: u32,
    n_kv_heads: u32,
    splits: u32,
}

@group(0) @binding(0) var<uniform> params: CombineParams;
@group(0) @binding(1) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

const HEAD_VEC4S: u32 = HEAD_DIM / 4u;
// attention.wgsl's stand-in for -infinity.
const NO_MAX: f32 = -3.0e38;

@compute @workgroup_size(WG)
fn attention_combine(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let index = (wg.x + wg.y * groups.x) * WG + lane;
    if index >= params.n_seqs * params.n_heads * HEAD_VEC4S {
        return;
    }
    let c = index % HEAD_VEC4S;
    let row = index / HEAD_VEC4S;
    let seq = row / params.n_heads;
    let head = row % params.n_heads;
    let group_size = params.n_heads / params.n_kv_heads;
    let chunks = group_size / GROUP_HEADS;
    let group = (seq * params.n_kv_heads + head / group_size) * chunks + head % group_size / GROUP_HEADS;
    let h = head % GROUP_HEADS;
    let first = group * params.splits;
    let stats = params.n_seqs * params.n_kv_heads * chunks * params.splits * GROUP_HEADS * HEAD_VEC4S;

    var m = NO_MAX;
    for (var s = 0u; s < params.splits; s++) {
        m = max(m, partials[stats + (first + s) * GROUP_HEADS + h].x);
    }
    var acc = vec4<f32>(0.0);
    var sum = 0.0;
    for (var s = 0u; s < params.splits; s++) {
        let split = partials[stats + (first + s) * GROUP_HEADS + h];
        let weight = exp(split.x - m);
        sum += weight * split.y;
        acc += weight * partials[((first + s) * GROUP_HEADS + h) * HEAD_VEC4S + c];
    }
    out[row * HEAD_VEC4S + c] = select(vec4<f32>(0.0), acc / sum, sum > 0.0);
}
