// Softmax over the last dimension: y = exp(s·x - max(s·x)) / Σ exp(s·x - max(s·x)), s a scale.
//
// Layout: `x` (and `y`) hold `params.rows` rows of `params.n` contiguous f32. With IN_PLACE
// the result overwrites `x` and there is no `y` binding.
// Workgroup: WG_SIZE invocations handle ROWS_PER_WG consecutive rows; the grid may be 2-D
// (workgroup index = wg.x + wg.y * num_workgroups.x). Each row belongs to a team of lanes; each
// lane keeps a running (max, sum of exp(v - max)) over elements lane, lane + team size, ...
// ("online" softmax: one exp per element, one pass), the team combines the pairs, then each
// lane writes its elements:
// - plain: a team is WG_SIZE / ROWS_PER_WG consecutive invocations; the pairs meet in
//   workgroup memory behind one barrier.
// - SUBGROUPS: a team is a subgroup, which takes the workgroup's rows subgroup_id,
//   subgroup_id + num_subgroups, ... and combines with subgroupMax and subgroupAdd: no barrier.
// Bounds: any n >= 1 and any number of rows. -inf inputs (masked logits) give 0; a row
// without any finite input gives NaN.

struct Params {
    rows: u32,
    n: u32,
    scale: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
#if IN_PLACE
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
#else
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#endif

// The running max starts at the lowest finite f32 rather than -inf, so that max - max is never
// inf - inf.
const LOWEST: f32 = -3.4028234663852886e38;

fn store(i: u32, value: f32) {
#if IN_PLACE
    x[i] = value;
#else
    y[i] = value;
#endif
}

// A running max and the sum of exp(v - max) over the values seen.
struct Running {
    max: f32,
    sum: f32,
}

fn scan(first: u32, team_lane: u32, team_lanes: u32) -> Running {
    var r = Running(LOWEST, 0.0);
    for (var j = team_lane; j < params.n; j += team_lanes) {
        let v = x[first + j] * params.scale;
        // One exp either way: of (old max - v) when v is the new max, else of (v - max).
        let e = exp(-abs(v - r.max));
        r.sum = select(r.sum + e, r.sum * e + 1.0, v > r.max);
        r.max = max(r.max, v);
    }
    return r;
}

fn write_probabilities(first: u32, team_lane: u32, team_lanes: u32, row: Running) {
    let inv_sum = 1.0 / row.sum;
    for (var j = team_lane; j < params.n; j += team_lanes) {
        store(first + j, exp(x[first + j] * params.scale - row.max) * inv_sum);
    }
}

#if SUBGROUPS
@compute @workgroup_size(WG_SIZE)
fn softmax(
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
    // The loop's bounds are the same for the whole workgroup, so the subgroup operations run in
    // uniform control flow; teams without a row this step combine empty pairs.
    for (var step = 0u; step < ROWS_PER_WG; step += subgroups) {
        let team_row = step + subgroup;
        let row = first_row + team_row;
        let has_row = team_row < ROWS_PER_WG && row < params.rows;
        var mine = Running(LOWEST, 0.0);
        if has_row {
            mine = scan(row * params.n, subgroup_lane, team_lanes);
        }
        let row_max = subgroupMax(mine.max);
        let row_sum = subgroupAdd(mine.sum * exp(mine.max - row_max));
        if has_row {
            write_probabilities(row * params.n, subgroup_lane, team_lanes, Running(row_max, row_sum));
        }
    }
}
#else
var<workgroup> partial_max: array<f32, WG_SIZE>;
var<workgroup> partial_sum: array<f32, WG_SIZE>;

@compute @workgroup_size(WG_SIZE)
fn softmax(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    const TEAM_LANES = WG_SIZE / ROWS_PER_WG;
    let team = lane / TEAM_LANES;
    let team_lane = lane % TEAM_LANES;
    let row = (wg.x + wg.y * groups.x) * ROWS_PER_WG + team;
    let has_row = row < params.rows;
    var mine = Running(LOWEST, 0.0);
    if has_row {
        mine = scan(row * params.n, team_lane, TEAM_LANES);
    }
    partial_max[lane] = mine.max;
    partial_sum[lane] = mine.sum;
    workgroupBarrier();
    // Every lane of a team combines the team's pairs in the same order, so all agree on the
    // row's max and sum without a second barrier to broadcast them.
    let team_first = team * TEAM_LANES;
    var row_max = LOWEST;
    for (var k = 0u; k < TEAM_LANES; k++) {
        row_max = max(row_max, partial_max[team_first + k]);
    }
    var row_sum = 0.0;
    for (var k = 0u; k < TEAM_LANES; k++) {
        row_sum += partial_sum[team_first + k] * exp(partial_max[team_first + k] - row_max);
    }
    if has_row {
        write_probabilities(row * params.n, team_lane, TEAM_LANES, Running(row_max, row_sum));
    }
}
#endif
