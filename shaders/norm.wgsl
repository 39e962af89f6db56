// RMSNorm over the last dimension: y = x / sqrt(mean(x²) + eps) * w, or * (1 + w) with
// ONE_PLUS_WEIGHT (the Hugging Face Gemma convention).
//
// Layout: `x` (and `y`) hold `params.rows` rows of `params.dim` contiguous f32; `weight` holds
// `params.dim` f32. With IN_PLACE the result overwrites `x` and there is no `y` binding.
// Workgroup: WG_SIZE invocations handle ROWS_PER_WG consecutive rows; the grid may be 2-D
// (workgroup index = wg.x + wg.y * num_workgroups.x). Each row belongs to a team of lanes that
// sums the squares of its elements lane, lane + team size, ..., then scales the same elements:
// - plain: a team is WG_SIZE / ROWS_PER_WG consecutive invocations; the partial sums meet in
//   workgroup memory behind one barrier.
// - SUBGROUPS: a team is a subgroup, which takes the workgroup's rows subgroup_id,
//   subgroup_id + num_subgroups, ... and adds with subgroupAdd: no barrier at all.
// Bounds: any dim >= 1 and any number of rows (rows * dim must fit one binding).

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
#if IN_PLACE
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
#else
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

fn store(i: u32, value: f32) {
#if IN_PLACE
    x[i] = value;
#else
    y[i] = value;
#endif
}

fn sum_squares(first: u32, team_lane: u32, team_lanes: u32) -> f32 {
    var sum = 0.0;
    for (var j = team_lane; j < params.dim; j += team_lanes) {
        let v = x[first + j];
        sum += v * v;
    }
    return sum;
}

fn write_normalized(first: u32, team_lane: u32, team_lanes: u32, sum_squares: f32) {
    let inv_rms = inverseSqrt(sum_squares / f32(params.dim) + params.eps);
    for (var j = team_lane; j < params.dim; j += team_lanes) {
#if ONE_PLUS_WEIGHT
        let scale = 1.0 + weight[j];
#else
        let scale = weight[j];
#endif
        store(first + j, x[first + j] * inv_rms * scale);
    }
}

#if SUBGROUPS
@compute @workgroup_size(WG_SIZE)
fn rms_norm(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(subgroup_id) subgroup: u32,
    @builtin(num_subgroups) subgroups: u32,
    @builtin(subgroup_invocation_id) subgroup_lane: u32,
    @builtin(subgroup_size) subgroup_size: u32,
) {
    let first_row = (wg.x + wg.y * groups.x) * ROWS_PER_WG;
    // A subgroup wider than the workgroup has only the workgroup's invocations.
    let team_lanes = min(subgroup_size, WG_SIZE);
    // The loop's bounds are the same for the whole workgroup, so subgroupAdd runs in uniform
    // control flow; teams without a row this step add zeros.
    for (var step = 0u; step < ROWS_PER_WG; step += subgroups) {
        let team_row = step + subgroup;
        let row = first_row + team_row;
        let has_row = team_row < ROWS_PER_WG && row < params.rows;
        var partial = 0.0;
        if has_row {
            partial = sum_squares(row * params.dim, subgroup_lane, team_lanes);
        }
        let total = subgroupAdd(partial);
        if has_row {
            write_normalized(row * params.dim, subgroup_lane, team_lanes, total);
        }
    }
}
#else
var<workgroup> partial_sums: array<f32, WG_SIZE>;

@compute @workgroup_size(WG_SIZE)
fn rms_norm(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    const TEAM_LANES = WG_SIZE / ROWS_PER_WG;
    let team = lane / TEAM_LANES;
    let team_lane = lane % TEAM_LANES;
    let row = (wg.x + wg.y * groups.x) * ROWS_PER_WG + team;
    let has_row = row < params.rows;
    var partial = 0.0;
    if has_row {
        partial = sum_squares(row * params.dim, team_lane, TEAM_LANES);
    }
    partial_sums[lane] = partial;
    workgroupBarrier();
    // Every lane of a team adds the team's partial sums in the same order, so all agree on the
    // total without a second barrier to broadcast it.
    var total = 0.0;
    for (var k = 0u; k < TEAM_LANES; k++) {
        total += partial_sums[team * TEAM_LANES + k];
    }
    if has_row {
        write_normalized(row * params.dim, team_lane, TEAM_LANES, total);
    }
}
#endif
