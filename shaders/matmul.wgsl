// Quantized matrix × vector and matrix × matrix: y[b, r] = sum_k W[r, k] * x[b, k].
//
// Composed after shaders/quant/common.wgsl and one decoder, which supply decode8().
// Layout: `weights` is one chunk of W (rows first_row .. first_row + rows, `row_words` words a
//   row, see common.wgsl); x is [batch, cols] f32 as vec4s; y is [batch, out_rows] f32, of
//   which this dispatch writes columns first_row .. first_row + rows. cols is a multiple of 8.
// Workgroup: WG_SIZE invocations. THREADS_PER_ROW consecutive invocations share a row, each
//   taking every THREADS_PER_ROW-th group of 8 weights, so a workgroup covers
//   WG_SIZE / THREADS_PER_ROW rows; each invocation keeps BATCH_TILE sums, one per batch row,
//   so every decoded weight is used BATCH_TILE times. The partial sums of a row are added by
//   subgroupShuffleXor (SUBGROUP_REDUCE: needs THREADS_PER_ROW <= the subgroup size and
//   subgroups made of consecutive invocations) or in workgroup memory (SHARED_REDUCE);
//   THREADS_PER_ROW = 1 needs neither.
// Grid: x (+ y past 65535) over row groups, linear index wg.x + wg.y * num_workgroups.x;
//   z over batch tiles of BATCH_TILE. Rows past the chunk and batch rows past `batch` compute
//   on clamped indices (so barriers stay in uniform control flow) and write nothing.

struct Params {
    rows: u32,
    first_row: u32,
    cols: u32,
    batch: u32,
    row_words: u32,
    blocks: u32,
    out_rows: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> weights: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

const ROWS_PER_WG: u32 = WG_SIZE / THREADS_PER_ROW;

#if SHARED_REDUCE
var<workgroup> partial: array<f32, WG_SIZE * BATCH_TILE>;
#endif

@compute @workgroup_size(WG_SIZE)
fn matmul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let part = lane % THREADS_PER_ROW;
    let r = (wg.x + wg.y * groups.x) * ROWS_PER_WG + lane / THREADS_PER_ROW;
    let row = WeightRow(min(r, params.rows - 1u) * params.row_words, params.blocks);
    let b0 = wg.z * BATCH_TILE;
    let x_row_vec4s = params.cols / 4u;
    var x_rows: array<u32, BATCH_TILE>;
    for (var t = 0u; t < BATCH_TILE; t++) {
        x_rows[t] = min(b0 + t, params.batch - 1u) * x_row_vec4s;
    }

    var acc: array<f32, BATCH_TILE>;
    for (var g = part; g < params.cols / 8u; g += THREADS_PER_ROW) {
        let w = decode8(row, g * 8u);
        for (var t = 0u; t < BATCH_TILE; t++) {
            let xi = x_rows[t] + 2u * g;
            acc[t] += dot(w.lo, x[xi]) + dot(w.hi, x[xi + 1u]);
        }
    }

#if SUBGROUP_REDUCE
    for (var t = 0u; t < BATCH_TILE; t++) {
        for (var mask = THREADS_PER_ROW / 2u; mask > 0u; mask /= 2u) {
            acc[t] += subgroupShuffleXor(acc[t], mask);
        }
    }
#endif
#if SHARED_REDUCE
    for (var t = 0u; t < BATCH_TILE; t++) {
        partial[t * WG_SIZE + lane] = acc[t];
    }
    workgroupBarrier();
    for (var stride = THREADS_PER_ROW / 2u; stride > 0u; stride /= 2u) {
        if part < stride {
            for (var t = 0u; t < BATCH_TILE; t++) {
                partial[t * WG_SIZE + lane] += partial[t * WG_SIZE + lane + stride];
            }
        }
        workgroupBarrier();
    }
    for (var t = 0u; t < BATCH_TILE; t++) {
        acc[t] = partial[t * WG_SIZE + lane];
    }
#endif

    if part == 0u && r < params.rows {
        for (var t = 0u; t < BATCH_TILE; t++) {
            if b0 + t < params.batch {
                y[(b0 + t) * params.out_rows + params.first_row + r] = acc[t];
            }
        }
    }
}
