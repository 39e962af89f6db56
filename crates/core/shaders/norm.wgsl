// RMSNorm over the last dimension: y = x / sqrt(mean(x²) + eps) * w, or * (1 + w) with
// ONE_PLUS_WEIGHT (the Hugging Face Gemma convention).
//
// Layout: `x` (and `y`) hold `params.rows` rows of `params.dim` contiguous f32; `weight` holds
// `params.dim` f32. With IN_PLACE the result overwrites `x` and there is no `y` binding.
//
// RESIDUAL: the joint between two sublayers of a model that normalises each sublayer's output
// before adding it to the residual stream (Gemma). `p` (the sublayer's output) is normalised
// with `weight` and added to the residual stream `x`, in place; then with NEXT the new `x` is
// normalised again with `next_weight` and `params.next_eps` into `y`, the next sublayer's
// input. `p` and `next_weight` have `x`'s shape and `weight`'s; one convention serves both.
//
// Workgroup: WG_SIZE invocations handle ROWS_PER_WG consecutive rows; the grid may be 2-D
// (workgroup index = wg.x + wg.y * num_workgroups.x). Each row belongs to a team of lanes that
// sums the squares of its elements lane, lane + team size, ..., then scales the same elements:
// - plain: a team is WG_SIZE / ROWS_PER_WG consecutive invocations; the partial sums meet in
//   workgroup memory behind one barrier (two with RESIDUAL and NEXT: one per norm).
// - SUBGROUPS: a team is a subgroup, which takes the workgroup's rows subgroup_id,
//   subgroup_id + num_subgroups, ... and adds with subgroupAdd: no barrier at all.
// A lane rewrites only the elements it read, so the second norm of RESIDUAL reads back what the
// same lane added.
// Bounds: any dim >= 1 and any number of rows (rows * dim must fit one binding).

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    // RESIDUAL with NEXT: the second norm's eps.
    next_eps: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
#if RESIDUAL
@group(0) @binding(2) var<storage, read> p: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;
#if NEXT
@group(0) @binding(4) var<storage, read> next_weight: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
#endif
#else
#if IN_PLACE
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
#else
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif
#endif

// The element that the (first) norm reads.
fn norm_input(i: u32) -> f32 {
#if RESIDUAL
    return p[i];
#else
    return x[i];
#endif
}

fn scale_of(w: f32) -> f32 {
#if ONE_PLUS_WEIGHT
    return 1.0 + w;
#else
    return w;
#endif
}

fn inverse_rms(sum_squares: f32, eps: f32) -> f32 {
    return inverseSqrt(sum_squares / f32(params.dim) + eps);
}

fn sum_squares(first: u32, team_lane: u32, team_lanes: u32) -> f32 {
    var sum = 0.0;
    for (var j = team_lane; j < params.dim; j += team_lanes) {
        let v = norm_input(first + j);
        sum += v * v;
    }
    return sum;
}

#if RESIDUAL
// x += rms_norm(p): returns the sum of the squares of the lane's new elements of x.
fn add_normalized(first: u32, team_lane: u32, team_lanes: u32, sum_squares: f32) -> f32 {
    let inv_rms = inverse_rms(sum_squares, params.eps);
    var new_squares = 0.0;
    for (var j = team_lane; j < params.dim; j += team_lanes) {
        let v = x[first + j] + p[first + j] * inv_rms * scale_of(weight[j]);
        x[first + j] = v;
        new_squares += v * v;
    }
    return new_squares;
}

#if NEXT
fn write_next_normalized(first: u32, team_lane: u32, team_lanes: u32, sum_squares: f32) {
    let inv_rms = inverse_rms(sum_squares, params.next_eps);
    for (var j = team_lane; j < params.dim; j += team_lanes) {
        y[first + j] = x[first + j] * inv_rms * scale_of(next_weight[j]);
    }
}
#endif
#else
fn store(i: u32, value: f32) {
#if IN_PLACE
    x[i] = value;
#else
    y[i] = value;
#endif
}

fn write_normalized(first: u32, team_lane: u32, team_lanes: u32, sum_squares: f32) {
    let inv_rms = inverse_rms(sum_squares, params.eps);
    for (var j = team_lane; j < params.dim; j += team_lanes) {
        store(first + j, x[first + j] * inv_rms * scale_of(weight[j]));
    }
}
#endif

#if SUBGROUPS
@compute @workgroup_size(WG_SIZE)
#if RESIDUAL
fn rms_norm_residual(
#else
fn rms_norm(
#endif
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
#if RESIDUAL
        var new_squares = 0.0;
        if has_row {
            new_squares = add_normalized(row * params.dim, subgroup_lane, team_lanes, total);
        }
#if NEXT
        let new_total = subgroupAdd(new_squares);
        if has_row {
            write_next_normalized(row * params.dim, subgroup_lane, team_lanes, new_total);
        }
#endif
#else
        if has_row {
            write_normalized(row * params.dim, subgroup_lane, team_lanes, total);
        }
#endif
    }
}
#else
var<workgroup> partial_sums: array<f32, WG_SIZE>;
#if NEXT
var<workgroup> next_partial_sums: array<f32, WG_SIZE>;
#endif

@compute @workgroup_size(WG_SIZE)
#if RESIDUAL
fn rms_norm_residual(
#else
fn rms_norm(
#endif
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
#if RESIDUAL
    var new_squares = 0.0;
    if has_row {
        new_squares = add_normalized(row * params.dim, team_lane, TEAM_LANES, total);
    }
#if NEXT
    // A second array: lanes of the team may still be reading the first.
    next_partial_sums[lane] = new_squares;
    workgroupBarrier();
    var new_total = 0.0;
    for (var k = 0u; k < TEAM_LANES; k++) {
        new_total += next_partial_sums[team * TEAM_LANES + k];
    }
    if has_row {
        write_next_normalized(row * params.dim, team_lane, TEAM_LANES, new_total);
    }
#endif
#else
    if has_row {
        write_normalized(row * params.dim, team_lane, TEAM_LANES, total);
    }
#endif
}
#endif
