// Causal prefill attention over a paged KV cache: many query tokens, from one or several
// sequences, each at its own position p, attending to keys 0 ..= p of its own sequence (the last
// `window` of them with a sliding window). The keys of the tokens themselves must already be in
// the cache (kv_store.wgsl), so a chunk of a prompt whose start is cached needs nothing else.
// Follows attention.wgsl.
//
// Layout: q and out [n_tokens, n_heads, HEAD_DIM] f32; seq_ids and positions u32 [n_tokens];
// block_table u32 [n_seqs, max_blocks_per_seq]; k_cache, v_cache as in attention.wgsl.
// Workgroup: WG = ROWS * LANES invocations per (tile of ROWS consecutive tokens, query head),
// linear index tile * n_heads + head on a 1-D or 2-D grid. Invocation (row r, lane l) holds the
// scaled query and the output accumulator of row r for vec4s l, l + LANES, ... in registers.
// The tile's rows are split into runs of consecutive rows of the same sequence; for each run,
// keys are walked in tiles of TILE_KEYS whose K and V are loaded once into workgroup memory and
// shared by the run's rows. Partial dot products meet in workgroup memory; three barriers per key
// tile. Tokens may come in any order, but rows grouped by sequence in increasing positions make
// few runs and little masked work.
// A token whose seq_id is not a row of the block table (e.g. 0xffffffff for padding) sees no
// keys and gets zeros; positions past the block table row's capacity are clamped to it.
// Defines: HEAD_DIM, ROWS, LANES, TILE_KEYS (the launcher picks the most that fit 16 KiB of
// workgroup memory). Bounds: HEAD_DIM a multiple of 4, at most 256.
//
// SERIAL (for CPU devices such as lavapipe; see attention_decode.wgsl's SERIAL): WG lanes in one
// subgroup per (tile of ROWS consecutive tokens, kv head, chunk of GROUP_HEADS of its query
// heads), linear index (tile * n_kv_heads + kv_head) * chunks + chunk. The lanes split each head's
// dims (vec4s lane, lane + WG, ...) and walk the keys together, one at a time, each key and value
// loaded once for the tile's rows and heads; a subgroupAdd makes each score. No workgroup memory,
// no barrier. The tile's rows are split into runs of one sequence as above.
// Defines: HEAD_DIM, ROWS, WG, GROUP_HEADS (a divisor of n_heads / n_kv_heads).

@group(0) @binding(0) var<uniform> params: AttentionParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
// KV_TEXTURES (SERIAL): the cache's keys and values copied into textures, read instead of the
// buffers (see cached_key in attention.wgsl).
#if KV_TEXTURES
@group(0) @binding(2) var k_texture: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(3) var v_texture: texture_storage_2d<rgba32uint, read>;
#else
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
#endif
@group(0) @binding(4) var<storage, read> seq_ids: array<u32>;
@group(0) @binding(5) var<storage, read> positions: array<u32>;
@group(0) @binding(6) var<storage, read> block_table: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<vec4<f32>>;

#if SERIAL
// The (row, head) pairs of a workgroup.
const SLOTS: u32 = ROWS * GROUP_HEADS;
const NO_SEQ: u32 = 0xffffffffu;

@compute @workgroup_size(WG)
fn attention_prefill(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let chunks = params.n_heads / params.n_kv_heads / GROUP_HEADS;
    let group = wg.x + wg.y * groups.x;
    let n_tiles = (params.n_rows + ROWS - 1u) / ROWS;
    if group >= n_tiles * params.n_kv_heads * chunks {
        return;
    }
    let first_token = group / (params.n_kv_heads * chunks) * ROWS;
    let kv_head = group / chunks % params.n_kv_heads;
    let first_head = kv_head * (params.n_heads / params.n_kv_heads) + group % chunks * GROUP_HEADS;
    let rows = min(ROWS, params.n_rows - first_token);

    // Per row its sequence and the keys it sees, first_key[r] .. end_key[r]; per (row, head)
    // this lane's vec4s of the scaled query.
    var row_seq: array<u32, ROWS>;
    var first_key: array<u32, ROWS>;
    var end_key: array<u32, ROWS>;
    var query: array<vec4<f32>, SLOTS * LANE_VEC4S>;
    for (var r = 0u; r < ROWS; r++) {
        row_seq[r] = NO_SEQ;
        if r < rows {
            let token = first_token + r;
            row_seq[r] = seq_ids[token];
            if row_seq[r] < params.n_seqs {
                let position = min(positions[token], table_capacity() - 1u);
                first_key[r] = first_visible_key(position);
                end_key[r] = position + 1u;
            }
            for (var h = 0u; h < GROUP_HEADS; h++) {
                let q_base = (token * params.n_heads + first_head + h) * HEAD_VEC4S;
                for (var j = 0u; j < LANE_VEC4S; j++) {
                    let inside = lane + j * WG < HEAD_VEC4S;
                    let x = q[q_base + lane_vec4(lane, j)] * params.scale;
                    query[(r * GROUP_HEADS + h) * LANE_VEC4S + j] = select(vec4<f32>(0.0), x, inside);
                }
            }
        }
    }

    var acc: array<vec4<f32>, SLOTS * LANE_VEC4S>;
    var running_max: array<f32, SLOTS>;
    var sum: array<f32, SLOTS>;
    for (var s = 0u; s < SLOTS; s++) {
        running_max[s] = NO_MAX;
    }
    // Runs of consecutive rows of one sequence, each walking the keys any of its rows sees.
    var run_start = 0u;
    while run_start < rows {
        let seq = row_seq[run_start];
        var run_end = run_start + 1u;
        while run_end < rows && row_seq[run_end] == seq {
            run_end++;
        }
        var keys = vec2<u32>(0xffffffffu, 0u);
        for (var r = run_start; r < run_end; r++) {
            if end_key[r] > first_key[r] {
                keys = vec2<u32>(min(keys.x, first_key[r]), max(keys.y, end_key[r]));
            }
        }
        for (var key = keys.x; key < keys.y; key++) {
            let base = cache_vec4_index(key_slot(seq, key), kv_head);
            var k: array<vec4<f32>, LANE_VEC4S>;
            var v: array<vec4<f32>, LANE_VEC4S>;
            for (var j = 0u; j < LANE_VEC4S; j++) {
                k[j] = cached_key(base + lane_vec4(lane, j));
                v[j] = cached_value(base + lane_vec4(lane, j));
            }
            for (var r = 0u; r < ROWS; r++) {
                let sees = r >= run_start && r < run_end && key >= first_key[r] && key < end_key[r];
                for (var h = 0u; h < GROUP_HEADS; h++) {
                    let s = r * GROUP_HEADS + h;
                    var partial = 0.0;
                    for (var j = 0u; j < LANE_VEC4S; j++) {
                        partial += dot(query[s * LANE_VEC4S + j], k[j]);
                    }
                    // The same in every lane: all agree on the weights. A row that does not see
                    // the key keeps its maximum and adds nothing.
                    let step = softmax_step(running_max[s], sum[s], soft_cap(subgroupAdd(partial)), sees);
                    running_max[s] = step.x;
                    sum[s] = step.y;
                    for (var j = 0u; j < LANE_VEC4S; j++) {
                        acc[s * LANE_VEC4S + j] = acc[s * LANE_VEC4S + j] * step.z + step.w * v[j];
                    }
                }
            }
        }
        run_start = run_end;
    }

    for (var r = 0u; r < rows; r++) {
        for (var h = 0u; h < GROUP_HEADS; h++) {
            let s = r * GROUP_HEADS + h;
            let out_base = ((first_token + r) * params.n_heads + first_head + h) * HEAD_VEC4S;
            for (var j = 0u; j < LANE_VEC4S; j++) {
                if lane + j * WG < HEAD_VEC4S {
                    // The key at the running maximum contributes exp(0) = 1: the sum is 0 only
                    // with no keys.
                    out[out_base + lane + j * WG] =
                        select(vec4<f32>(0.0), acc[s * LANE_VEC4S + j] / sum[s], sum[s] > 0.0);
                }
            }
        }
    }
}
#else
const WG: u32 = ROWS * LANES;
// vec4s of a head held by one lane.
const VEC4S_PER_LANE: u32 = (HEAD_VEC4S + LANES - 1u) / LANES;
// Marks a row past the last token in row_seq.
const NO_SEQ: u32 = 0xffffffffu;

var<workgroup> k_tile: array<vec4<f32>, TILE_KEYS * HEAD_VEC4S>;
var<workgroup> v_tile: array<vec4<f32>, TILE_KEYS * HEAD_VEC4S>;
// partial_dots[key * WG + invocation]: one lane's share of a row's dot product with a key.
var<workgroup> partial_dots: array<f32, TILE_KEYS * WG>;
var<workgroup> row_seq: array<u32, ROWS>;
// The keys row r sees are row_first_key[r] .. row_end_key[r] (end exclusive; empty for none).
var<workgroup> row_first_key: array<u32, ROWS>;
var<workgroup> row_end_key: array<u32, ROWS>;
// The current run: (one past its last row, first key, one past the last key, sequence), made
// uniform through workgroupUniformLoad.
var<workgroup> run_info: vec4<u32>;

@compute @workgroup_size(WG)
fn attention_prefill(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) invocation: u32,
) {
    let group = wg.x + wg.y * groups.x;
    let n_tiles = (params.n_rows + ROWS - 1u) / ROWS;
    if group >= n_tiles * params.n_heads {
        return;
    }
    let first_token = (group / params.n_heads) * ROWS;
    let head = group % params.n_heads;
    let kv_head = kv_head_of(head);
    let rows = min(ROWS, params.n_rows - first_token);
    let r = invocation / LANES;
    let lane = invocation % LANES;
    let token = first_token + r;

    var seq = NO_SEQ;
    var first_key = 0u;
    var end_key = 0u;
    var q_scaled: array<vec4<f32>, VEC4S_PER_LANE>;
    if r < rows {
        seq = seq_ids[token];
        if seq < params.n_seqs {
            let position = min(positions[token], table_capacity() - 1u);
            first_key = first_visible_key(position);
            end_key = position + 1u;
        }
        let q_base = (token * params.n_heads + head) * HEAD_VEC4S;
        for (var i = 0u; i < VEC4S_PER_LANE; i++) {
            let c = lane + i * LANES;
            if c < HEAD_VEC4S {
                q_scaled[i] = q[q_base + c] * params.scale;
            }
        }
    }
    if lane == 0u {
        row_seq[r] = seq;
        row_first_key[r] = first_key;
        row_end_key[r] = end_key;
    }
    workgroupBarrier();

    var running_max = NO_MAX;
    var running_sum = 0.0;
    var acc: array<vec4<f32>, VEC4S_PER_LANE>;
    var run_start = 0u;
    loop {
        if invocation == 0u {
            let run_seq = row_seq[run_start];
            var run_end = run_start + 1u;
            while run_end < rows && row_seq[run_end] == run_seq {
                run_end++;
            }
            var keys = vec2<u32>(0xffffffffu, 0u);
            for (var i = run_start; i < run_end; i++) {
                if row_end_key[i] > row_first_key[i] {
                    keys = vec2<u32>(min(keys.x, row_first_key[i]), max(keys.y, row_end_key[i]));
                }
            }
            keys.x = min(keys.x, keys.y);
            run_info = vec4<u32>(run_end, keys, run_seq);
        }
        let run = workgroupUniformLoad(&run_info);
        let in_run = r >= run_start && r < run.x;

        for (var tile = run.y; tile < run.z; tile += TILE_KEYS) {
            for (var e = invocation; e < TILE_KEYS * HEAD_VEC4S; e += WG) {
                let key = tile + e / HEAD_VEC4S;
                var k = vec4<f32>(0.0);
                var v = vec4<f32>(0.0);
                // Keys past the run's end are masked below; zeros keep their dot products finite.
                if key < run.z {
                    let index = cache_vec4_index(key_slot(run.w, key), kv_head) + e % HEAD_VEC4S;
                    k = k_cache[index];
                    v = v_cache[index];
                }
                k_tile[e] = k;
                v_tile[e] = v;
            }
            workgroupBarrier();

            if in_run {
                for (var t = 0u; t < TILE_KEYS; t++) {
                    var partial = 0.0;
                    for (var i = 0u; i < VEC4S_PER_LANE; i++) {
                        let c = lane + i * LANES;
                        if c < HEAD_VEC4S {
                            partial += dot(q_scaled[i], k_tile[t * HEAD_VEC4S + c]);
                        }
                    }
                    partial_dots[t * WG + invocation] = partial;
                }
            }
            workgroupBarrier();

            if in_run {
                // The row's lanes all compute the same scores and maximum.
                var scores: array<f32, TILE_KEYS>;
                var tile_max = NO_MAX;
                for (var t = 0u; t < TILE_KEYS; t++) {
                    let key = tile + t;
                    var dot_qk = 0.0;
                    for (var l = 0u; l < LANES; l++) {
                        dot_qk += partial_dots[t * WG + r * LANES + l];
                    }
                    if key >= first_key && key < end_key {
                        scores[t] = soft_cap(dot_qk);
                        tile_max = max(tile_max, scores[t]);
                    }
                }
                let new_max = max(running_max, tile_max);
                let rescale = exp(running_max - new_max);
                running_sum *= rescale;
                for (var i = 0u; i < VEC4S_PER_LANE; i++) {
                    acc[i] *= rescale;
                }
                for (var t = 0u; t < TILE_KEYS; t++) {
                    let key = tile + t;
                    if key >= first_key && key < end_key {
                        let p = exp(scores[t] - new_max);
                        running_sum += p;
                        for (var i = 0u; i < VEC4S_PER_LANE; i++) {
                            let c = lane + i * LANES;
                            if c < HEAD_VEC4S {
                                acc[i] += p * v_tile[t * HEAD_VEC4S + c];
                            }
                        }
                    }
                }
                running_max = new_max;
            }
            // The next tile overwrites k_tile, v_tile and partial_dots.
            workgroupBarrier();
        }

        run_start = run.x;
        if run_start >= rows {
            break;
        }
    }

    if r < rows {
        // The key at the running maximum contributes exp(0) = 1: the sum is 0 only with no keys.
        let inv_sum = select(0.0, 1.0 / running_sum, running_sum > 0.0);
        let out_base = (token * params.n_heads + head) * HEAD_VEC4S;
        for (var i = 0u; i < VEC4S_PER_LANE; i++) {
            let c = lane + i * LANES;
            if c < HEAD_VEC4S {
                out[out_base + c] = acc[i] * inv_sum;
            }
        }
    }
}
#endif
