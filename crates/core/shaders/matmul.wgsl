// Quantized matrix × vector and matrix × matrix: y[b, r] = sum_k W[r, k] * x[b, k].
//
// Composed after shaders/quant/common.wgsl and one decoder, which supply decode8().
// Layout: `weights` is one chunk of W (rows first_row .. first_row + rows, `row_words` words a
//   row, see common.wgsl); x is [batch, cols] f32 as vec4s; y is [batch, out_rows] f32, of
//   which this dispatch writes columns first_row .. first_row + rows. cols is a multiple of 8.
// Workgroup: WG_SIZE invocations. THREADS_PER_ROW consecutive invocations share ROW_TILE
//   consecutive rows, each taking every THREADS_PER_ROW-th group of 8 weights, so a workgroup
//   covers WG_SIZE / THREADS_PER_ROW * ROW_TILE rows; each invocation keeps ROW_TILE x
//   BATCH_TILE sums in registers, so every decoded weight is used BATCH_TILE times and every
//   activation loaded ROW_TILE times. The partial sums of a row are added by
//   subgroupShuffleXor (SUBGROUP_REDUCE: needs THREADS_PER_ROW <= the subgroup size and
//   subgroups made of consecutive invocations) or in workgroup memory (SHARED_REDUCE);
//   THREADS_PER_ROW = 1 needs neither. X_BROADCAST (WIDE, subgroups of at least 8): the
//   activations are the same for the whole subgroup, so for each block of 32 columns lane j
//   loads the j-th vec4 of it (of every batch row of the tile) and subgroupBroadcast hands
//   them to the others; on a CPU device, where a load is a gather over the SIMD lanes, that
//   turns 8 gathers of one useful value into 1 gather of 8. The last cols % 32 (float types)
//   are loaded plainly.
// X_UNIFORM: x (and x_up) are a window of X_WINDOW_VEC4S vec4s of the activations in a uniform
//   binding, batch rows first_batch .. first_batch + batch of them: lavapipe gathers uniform
//   loads with plain vector code where a storage load is a branchy loop over the lanes (about
//   2x fewer instructions per value). The host dispatches once per window.
// WIDE (THREADS_PER_ROW = 1): an invocation walks its rows a block of 32 weights at a time with
//   load32/unpack8, reading each word of a block once, then the last cols % 32 with decode8.
// Gated input (GATED, with GATE_SILU or GATE_GELU): x holds a feed-forward layer's gate and
//   x_up its up projection, and the product's activations are activation(gate) * up, computed
//   as they are loaded (composed after activation.wgsl): the pass over memory that a separate
//   gated-activation kernel makes is saved.
// Normalised input (NORMED, with NORM_ONE_PLUS for the 1 + w convention): the activations are
//   x RMS-normalised row by row with norm_weight, as an RMSNorm kernel before the product would
//   give them: each invocation scales x by the weight as it loads it, adds the squares of x to
//   a sum per batch row (kept beside the tile's sums and reduced with them), and multiplies the
//   products by 1 / sqrt(sum / cols + eps) at the end, which saves the norm's pass and dispatch.
// Residual input (RESIDUAL, with NORMED: Gemma 3's post-norms): the activations are
//   residual + post_norm(sublayer), normalised by the product's own norm as NORMED does, where
//   norm_weight holds the product's norm's weight then the post-norm's (cols each) and
//   post_norm is an RMSNorm of the sublayer's row. A prologue sums each batch row's squares of
//   the sublayer across the workgroup (the post-norm's 1 / rms, in post_scales); the sum itself
//   is computed as it is loaded, and the workgroups of the first row group of the first chunk
//   (write_sum) store it in residual_out, the residual stream for the layers after. That is the
//   joint between two sublayers, which took its own dispatch and pass, inside the next product.
// Outputs: y[b, r] for out_rows rows; or, with SPLIT (weights stacked from several matrices),
//   rows below second_row go to y, rows from second_row to third_row to y1 and, with THIRD,
//   the rest to y2, each [batch, its own rows]. ADD_TO_OUTPUT adds the products to what y
//   holds (a residual connection) instead of overwriting it.
// Grid: x (+ y past 65535) over row groups, linear index wg.x + wg.y * num_workgroups.x;
//   z over batch tiles of BATCH_TILE (of the window's batch rows with X_UNIFORM). Rows past the
//   chunk and batch rows past `batch` compute on clamped indices (so barriers and broadcasts
//   stay in uniform control flow) and write nothing.

struct Params {
    rows: u32,
    first_row: u32,
    cols: u32,
    batch: u32,
    row_words: u32,
    blocks: u32,
    out_rows: u32,
    second_row: u32,
    third_row: u32,
    eps: f32,
    // The batch row of the output that x's row 0 is (X_UNIFORM's windows; else 0).
    first_batch: u32,
    // RESIDUAL: 1 where this dispatch's first row group stores the residual sum.
    write_sum: u32,
}

// @binding(0): `weights`, declared in quant/common.wgsl.
#if X_UNIFORM
@group(0) @binding(1) var<uniform> x: array<vec4<f32>, X_WINDOW_VEC4S>;
#else
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#endif
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
// In a storage buffer where the weights are a texture (see quant/common.wgsl).
#if TEXTURE_WEIGHTS
@group(0) @binding(3) var<storage, read> params: Params;
#else
@group(0) @binding(3) var<uniform> params: Params;
#endif
// The parameters, copied once by each invocation: where they are a storage buffer, every read
// of `params` would be a load.
var<private> p: Params;
#if GATED
#if X_UNIFORM
@group(0) @binding(4) var<uniform> x_up: array<vec4<f32>, X_WINDOW_VEC4S>;
#else
@group(0) @binding(4) var<storage, read> x_up: array<vec4<f32>>;
#endif
#endif
#if SPLIT
@group(0) @binding(4) var<storage, read_write> y1: array<f32>;
#endif
#if THIRD
@group(0) @binding(5) var<storage, read_write> y2: array<f32>;
#endif
// The weight of the RMSNorm of a normalised input (RESIDUAL: then the post-norm's), after the
// outputs at NORM_BINDING; in a uniform binding where x is (lavapipe gathers those without a
// loop over the lanes).
#if NORMED
#if X_UNIFORM
@group(0) @binding(NORM_BINDING) var<uniform> norm_weight: array<vec4<f32>, NORM_VEC4S>;
#else
@group(0) @binding(NORM_BINDING) var<storage, read> norm_weight: array<vec4<f32>>;
#endif
const_assert !GATED;
#if RESIDUAL
// The sublayer's output, then where residual + post_norm(sublayer) goes, after the norm weights.
#if X_UNIFORM
@group(0) @binding(NORM_BINDING + 1) var<uniform> sublayer: array<vec4<f32>, X_WINDOW_VEC4S>;
#else
@group(0) @binding(NORM_BINDING + 1) var<storage, read> sublayer: array<vec4<f32>>;
#endif
@group(0) @binding(NORM_BINDING + 2) var<storage, read_write> residual_out: array<vec4<f32>>;
// Each batch row of the tile's post-norm factor, 1 / rms of its sublayer row.
var<private> post_scales: array<f32, BATCH_TILE>;
var<workgroup> residual_partials: array<f32, WG_SIZE>;
#endif
// Accumulators past the tile's sums: each batch row's sum of squares.
const NORM_SLOTS: u32 = BATCH_TILE;
#else
const NORM_SLOTS: u32 = 0u;
#endif

const ROWS_PER_WG: u32 = WG_SIZE / THREADS_PER_ROW * ROW_TILE;
const TILE: u32 = ROW_TILE * BATCH_TILE;
// The sums an invocation keeps: the tile's, then NORM_SLOTS more.
const SUMS: u32 = TILE + NORM_SLOTS;
#if X_BROADCAST
const_assert WIDE;
#endif
#if WIDE
const_assert THREADS_PER_ROW == 1u;
#endif

#if THIRD
const_assert SPLIT;
#endif

// Four activations, vec4 c4 of row `row` of x; `post`: RESIDUAL's post-norm for them (see
// post_norm4), else unused.
fn load_x(row: u32, c4: u32, post: vec4<f32>) -> vec4<f32> {
    let i = row * (p.cols / 4u) + c4;
#if GATED
    return activate4(x[i]) * x_up[i];
#else
#if RESIDUAL
    return x[i] + sublayer[i] * post;
#else
    return x[i];
#endif
#endif
}

// RESIDUAL: the post-norm of vec4 c4 of the tile's batch row t, its weight times the row's
// 1 / rms (callers hoist post_weight4 out of their loops over t: lavapipe would not).
fn post_norm4(weight4: vec4<f32>, t: u32) -> vec4<f32> {
#if RESIDUAL
    return weight4 * post_scales[t];
#else
    return vec4<f32>(0.0);
#endif
}

// Four weights of the norm from index i (as vec4s), as the convention applies them.
fn norm_scale4(i: u32) -> vec4<f32> {
#if NORM_ONE_PLUS
    return 1.0 + norm_weight[i];
#else
#if NORMED
    return norm_weight[i];
#else
    return vec4<f32>(1.0);
#endif
#endif
}

// Four weights of the post-norm from index c4 (as vec4s), after the product's norm's
// (RESIDUAL; else unused).
fn post_weight4(c4: u32) -> vec4<f32> {
#if RESIDUAL
#if NORM_ONE_PLUS
    return 1.0 + norm_weight[p.cols / 4u + c4];
#else
    return norm_weight[p.cols / 4u + c4];
#endif
#else
    return vec4<f32>(0.0);
#endif
}

#if RESIDUAL
const_assert NORMED;

// The post-norm factor (1 / rms) of the sublayer's row `row`, summed by all the workgroup's
// invocations (`lane` is this one's index); call it in uniform control flow.
fn sublayer_inv_rms(row: u32, lane: u32) -> f32 {
    var squares = 0.0;
    for (var c4 = lane; c4 < p.cols / 4u; c4 += WG_SIZE) {
        let v = sublayer[row * (p.cols / 4u) + c4];
        squares += dot(v, v);
    }
#if X_BROADCAST
    // Subgroups have at least 8 invocations here, so a workgroup of 8 is within one (lavapipe:
    // a barrier makes the driver run the workgroup as coroutines, 2x slower products).
    if WG_SIZE <= 8u {
        return inverseSqrt(subgroupAdd(squares) / f32(p.cols) + p.eps);
    }
#endif
    // A tree in workgroup memory (WG_SIZE is a power of two).
    residual_partials[lane] = squares;
    workgroupBarrier();
    for (var stride = WG_SIZE / 2u; stride > 0u; stride /= 2u) {
        if lane < stride {
            residual_partials[lane] += residual_partials[lane + stride];
        }
        workgroupBarrier();
    }
    squares = residual_partials[0];
    workgroupBarrier();
    return inverseSqrt(squares / f32(p.cols) + p.eps);
}
#endif

#if ADD_TO_OUTPUT
const_assert !SPLIT;
#endif
#if GATED
const_assert !SPLIT;
#endif

// Writes (or adds) the sum of batch row b and row `row` of the whole matrix to its output.
fn store(window_b: u32, row: u32, sum: f32) {
    let b = p.first_batch + window_b;
#if SPLIT
    if row >= p.third_row {
#if THIRD
        y2[b * (p.out_rows - p.third_row) + row - p.third_row] = sum;
#endif
        return;
    }
    if row >= p.second_row {
        y1[b * (p.third_row - p.second_row) + row - p.second_row] = sum;
        return;
    }
#endif
    let i = b * p.second_row + row;
#if ADD_TO_OUTPUT
    y[i] += sum;
#else
    y[i] = sum;
#endif
}

#if SHARED_REDUCE
var<workgroup> partial: array<f32, WG_SIZE * SUMS>;
#endif

// Adds weights 8g .. 8g + 8 of the tile's rows (`w`) times the same activations of each of the
// tile's batch rows from b0 to the tile's sums. NORMED: the activations are scaled by the norm's
// weight, and their squares added to the batch row's sum of squares (the 1/rms factor comes at
// the end).
fn accumulate(
    acc: ptr<function, array<f32, SUMS>>,
    w: ptr<function, array<Weights8, ROW_TILE>>,
    g: u32,
    b0: u32,
) {
    let scale_lo = norm_scale4(2u * g);
    let scale_hi = norm_scale4(2u * g + 1u);
    let post_lo = post_weight4(2u * g);
    let post_hi = post_weight4(2u * g + 1u);
    for (var t = 0u; t < BATCH_TILE; t++) {
        let row = min(b0 + t, p.batch - 1u);
        let raw_lo = load_x(row, 2u * g, post_norm4(post_lo, t));
        let raw_hi = load_x(row, 2u * g + 1u, post_norm4(post_hi, t));
#if NORMED
        (*acc)[TILE + t] += dot(raw_lo, raw_lo) + dot(raw_hi, raw_hi);
#endif
        accumulate_tile(acc, w, t, raw_lo * scale_lo, raw_hi * scale_hi);
    }
}

// Adds the tile's rows (`w`, 8 weights each) times 8 activations of the tile's batch row t.
fn accumulate_tile(
    acc: ptr<function, array<f32, SUMS>>,
    w: ptr<function, array<Weights8, ROW_TILE>>,
    t: u32,
    x_lo: vec4<f32>,
    x_hi: vec4<f32>,
) {
    for (var i = 0u; i < ROW_TILE; i++) {
        (*acc)[t * ROW_TILE + i] += dot((*w)[i].lo, x_lo) + dot((*w)[i].hi, x_hi);
    }
}

#if X_BROADCAST
// The activations of block `block` (32 columns) of the tile's batch rows from b0 as this lane
// holds them: vec4 lane % 8 of the block of each batch row, normalised by the norm's weight
// (NORMED: each row's squares are added to its sum).
fn load_block_x(acc: ptr<function, array<f32, SUMS>>, block: u32, b0: u32, lane: u32) -> array<vec4<f32>, BATCH_TILE> {
    let i = 8u * block + lane % 8u;
    let scale = norm_scale4(i);
    let post = post_weight4(i);
    var mine: array<vec4<f32>, BATCH_TILE>;
    for (var t = 0u; t < BATCH_TILE; t++) {
        let raw = load_x(min(b0 + t, p.batch - 1u), i, post_norm4(post, t));
#if NORMED
        // This lane's squares; the subgroup's are added once, after the last block.
        (*acc)[TILE + t] += dot(raw, raw);
#endif
        mine[t] = raw * scale;
    }
    return mine;
}

// Adds weights 8s .. 8s + 8 of a block of the tile's rows times the same activations, broadcast
// from lanes 2s and 2s + 1 of `mine` (load_block_x). WGSL wants the lanes as constants, hence
// one case a step.
fn accumulate_broadcast(
    acc: ptr<function, array<f32, SUMS>>,
    blocks: ptr<function, array<Block32, ROW_TILE>>,
    mine: ptr<function, array<vec4<f32>, BATCH_TILE>>,
    s: u32,
) {
    var w: array<Weights8, ROW_TILE>;
    for (var i = 0u; i < ROW_TILE; i++) {
        w[i] = unpack8((*blocks)[i], s);
    }
    for (var t = 0u; t < BATCH_TILE; t++) {
        let v = (*mine)[t];
        switch s {
            case 0u: { accumulate_tile(acc, &w, t, subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u)); }
            case 1u: { accumulate_tile(acc, &w, t, subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u)); }
            case 2u: { accumulate_tile(acc, &w, t, subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u)); }
            default: { accumulate_tile(acc, &w, t, subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u)); }
        }
    }
}
#endif

#if TILED
// TILED (GPUs, many batch rows): a workgroup of 256 invocations computes a tile of TILE_ROWS
// weight rows x TILE_BATCH batch rows, each invocation a 4 x 4 block of it, so that each weight
// is decoded once per 64 batch rows and each activation loaded once per 64 weight rows. The
// columns are walked TILE_K at a time: invocations 0 .. 127 decode 8 weights each of the tile's
// rows into workgroup memory, every invocation loads 4 activations (gated or normalised as
// load_x and norm_scale4 give them, the squares summed for NORMED), and after a barrier each
// adds up its 4 x 4 products over the TILE_K columns. No subgroup operations.
const_assert WG_SIZE == 256u && THREADS_PER_ROW == 1u;
const TILE_ROWS: u32 = 64u;
const TILE_BATCH: u32 = 64u;
const TILE_K: u32 = 16u;
// [TILE_K, TILE_ROWS] decoded weights and [TILE_K, TILE_BATCH] activations, 4 to a vec4.
var<workgroup> w_tile: array<vec4<f32>, TILE_K * TILE_ROWS / 4u>;
var<workgroup> x_tile: array<vec4<f32>, TILE_K * TILE_BATCH / 4u>;
#if NORMED
// Each invocation's sum of squares of its batch row's activations (4 invocations a row).
var<workgroup> square_sums: array<f32, WG_SIZE>;
#endif

@compute @workgroup_size(WG_SIZE)
fn matmul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    p = params;
    let r_base = (wg.x + wg.y * groups.x) * TILE_ROWS;
    let b_base = wg.z * TILE_BATCH;
    // This invocation's block of the tile: rows 4 * row_quad .., batch rows 4 * batch_quad ...
    let row_quad = lane % 16u;
    let batch_quad = lane / 16u;
    // What it decodes (lanes below 128: a row, and which 8 of the TILE_K columns) and loads (a
    // batch row, and which 4 of the columns).
    let decode_row = lane / 2u;
    let decode_half = lane % 2u;
    let row = WeightRow(min(r_base + decode_row, p.rows - 1u) * p.row_words, p.blocks);
    let load_b = lane / 4u;
    let load_c = lane % 4u;
    let x_row = min(b_base + load_b, p.batch - 1u);
#if RESIDUAL
    // The post-norm factor of this invocation's batch row: its 4 invocations' squares.
    var squares_of_sublayer = 0.0;
    for (var c4 = load_c; c4 < p.cols / 4u; c4 += 4u) {
        let v = sublayer[x_row * (p.cols / 4u) + c4];
        squares_of_sublayer += dot(v, v);
    }
    square_sums[lane] = squares_of_sublayer;
    workgroupBarrier();
    let first = lane & ~3u;
    let sublayer_squares = square_sums[first] + square_sums[first + 1u] + square_sums[first + 2u]
        + square_sums[first + 3u];
    post_scales[0] = inverseSqrt(sublayer_squares / f32(p.cols) + p.eps);
    workgroupBarrier();
    if p.write_sum != 0u && r_base == 0u && b_base + load_b < p.batch {
        for (var c4 = load_c; c4 < p.cols / 4u; c4 += 4u) {
            let sum = load_x(x_row, c4, post_norm4(post_weight4(c4), 0u));
            residual_out[(p.first_batch + b_base + load_b) * (p.cols / 4u) + c4] = sum;
        }
    }
#endif

    var squares = 0.0;
    // acc[j]: batch row 4 * batch_quad + j against the block's 4 rows.
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.cols; k0 += TILE_K) {
        if lane < 128u {
            let g = k0 / 8u + decode_half;
            var w = Weights8(vec4<f32>(0.0), vec4<f32>(0.0));
            if g < p.cols / 8u {
                w = decode8(row, g * 8u);
            }
            for (var e = 0u; e < 4u; e++) {
                w_tile[(decode_half * 8u + e) * (TILE_ROWS / 4u) + decode_row / 4u][decode_row % 4u] = w.lo[e];
                w_tile[(decode_half * 8u + 4u + e) * (TILE_ROWS / 4u) + decode_row / 4u][decode_row % 4u] = w.hi[e];
            }
        }
        let c4 = k0 / 4u + load_c;
        var xv = vec4<f32>(0.0);
        if c4 < p.cols / 4u {
            let raw = load_x(x_row, c4, post_norm4(post_weight4(c4), 0u));
#if NORMED
            squares += dot(raw, raw);
#endif
            xv = raw * norm_scale4(c4);
        }
        for (var e = 0u; e < 4u; e++) {
            x_tile[(load_c * 4u + e) * (TILE_BATCH / 4u) + load_b / 4u][load_b % 4u] = xv[e];
        }
        workgroupBarrier();
        for (var k = 0u; k < TILE_K; k++) {
            let w4 = w_tile[k * (TILE_ROWS / 4u) + row_quad];
            let x4 = x_tile[k * (TILE_BATCH / 4u) + batch_quad];
            acc[0] += w4 * x4.x;
            acc[1] += w4 * x4.y;
            acc[2] += w4 * x4.z;
            acc[3] += w4 * x4.w;
        }
        workgroupBarrier();
    }
#if NORMED
    square_sums[lane] = squares;
    workgroupBarrier();
#endif
    for (var j = 0u; j < 4u; j++) {
        let b = 4u * batch_quad + j;
#if NORMED
        let sum = square_sums[4u * b] + square_sums[4u * b + 1u] + square_sums[4u * b + 2u]
            + square_sums[4u * b + 3u];
        let inv_rms = inverseSqrt(sum / f32(p.cols) + p.eps);
#else
        let inv_rms = 1.0;
#endif
        for (var i = 0u; i < 4u; i++) {
            let r = r_base + 4u * row_quad + i;
            if b_base + b < p.batch && r < p.rows {
                store(b_base + b, p.first_row + r, acc[j][i] * inv_rms);
            }
        }
    }
}
#else
@compute @workgroup_size(WG_SIZE)
fn matmul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
#if X_BROADCAST
    @builtin(subgroup_invocation_id) subgroup_lane: u32,
#endif
) {
    p = params;
    let part = lane % THREADS_PER_ROW;
    let r0 = ((wg.x + wg.y * groups.x) * (WG_SIZE / THREADS_PER_ROW) + lane / THREADS_PER_ROW) * ROW_TILE;
    var rows: array<WeightRow, ROW_TILE>;
    for (var i = 0u; i < ROW_TILE; i++) {
        rows[i] = WeightRow(min(r0 + i, p.rows - 1u) * p.row_words, p.blocks);
    }
    let b0 = wg.z * BATCH_TILE;
#if RESIDUAL
    for (var t = 0u; t < BATCH_TILE; t++) {
        post_scales[t] = sublayer_inv_rms(min(b0 + t, p.batch - 1u), lane);
    }
    if p.write_sum != 0u && wg.x + wg.y == 0u {
        for (var t = 0u; t < BATCH_TILE; t++) {
            if b0 + t < p.batch {
                for (var c4 = lane; c4 < p.cols / 4u; c4 += WG_SIZE) {
                    let sum = load_x(b0 + t, c4, post_norm4(post_weight4(c4), t));
                    residual_out[(p.first_batch + b0 + t) * (p.cols / 4u) + c4] = sum;
                }
            }
        }
    }
#endif

    var acc: array<f32, SUMS>;
#if WIDE
    // Whole blocks of 32 weights: each word of a block is read once (see quant/common.wgsl).
    let groups32 = p.cols / 32u;
    for (var b = 0u; b < groups32; b++) {
        var blocks: array<Block32, ROW_TILE>;
        for (var i = 0u; i < ROW_TILE; i++) {
            blocks[i] = load32(rows[i], b * 32u);
        }
#if X_BROADCAST
        var mine = load_block_x(&acc, b, b0, subgroup_lane);
        // The four steps written out, so that each one's broadcast lanes are constants.
        accumulate_broadcast(&acc, &blocks, &mine, 0u);
        accumulate_broadcast(&acc, &blocks, &mine, 1u);
        accumulate_broadcast(&acc, &blocks, &mine, 2u);
        accumulate_broadcast(&acc, &blocks, &mine, 3u);
#else
        for (var s = 0u; s < 4u; s++) {
            var w: array<Weights8, ROW_TILE>;
            for (var i = 0u; i < ROW_TILE; i++) {
                w[i] = unpack8(blocks[i], s);
            }
            accumulate(&acc, &w, b * 4u + s, b0);
        }
#endif
    }
#if X_BROADCAST
#if NORMED
    // Each lane summed the squares of the vec4s it loaded of the blocks: add the subgroup's,
    // each vec4 once whatever the subgroup size (lanes past 8 load again what lane % 8 does).
    // Before the columns past the blocks, which every lane loads whole.
    for (var t = 0u; t < BATCH_TILE; t++) {
        acc[TILE + t] = subgroupAdd(select(0.0, acc[TILE + t], subgroup_lane < 8u));
    }
#endif
#endif
    // Columns past the last multiple of 32 (float types only), 8 at a time.
    let first_group = groups32 * 4u;
#else
    let first_group = part;
#endif
    for (var g = first_group; g < p.cols / 8u; g += THREADS_PER_ROW) {
        var w: array<Weights8, ROW_TILE>;
        for (var i = 0u; i < ROW_TILE; i++) {
            w[i] = decode8(rows[i], g * 8u);
        }
        accumulate(&acc, &w, g, b0);
    }

#if SUBGROUP_REDUCE
    for (var a = 0u; a < SUMS; a++) {
        for (var mask = THREADS_PER_ROW / 2u; mask > 0u; mask /= 2u) {
            acc[a] += subgroupShuffleXor(acc[a], mask);
        }
    }
#endif
#if SHARED_REDUCE
    for (var a = 0u; a < SUMS; a++) {
        partial[a * WG_SIZE + lane] = acc[a];
    }
    workgroupBarrier();
    for (var stride = THREADS_PER_ROW / 2u; stride > 0u; stride /= 2u) {
        if part < stride {
            for (var a = 0u; a < SUMS; a++) {
                partial[a * WG_SIZE + lane] += partial[a * WG_SIZE + lane + stride];
            }
        }
        workgroupBarrier();
    }
    for (var a = 0u; a < SUMS; a++) {
        acc[a] = partial[a * WG_SIZE + lane];
    }
#endif

    if part == 0u {
        for (var t = 0u; t < BATCH_TILE; t++) {
#if NORMED
            let inv_rms = inverseSqrt(acc[TILE + t] / f32(p.cols) + p.eps);
#else
            let inv_rms = 1.0;
#endif
            for (var i = 0u; i < ROW_TILE; i++) {
                if b0 + t < p.batch && r0 + i < p.rows {
                    store(b0 + t, p.first_row + r0 + i, acc[t * ROW_TILE + i] * inv_rms);
                }
            }
        }
    }
}
#endif
