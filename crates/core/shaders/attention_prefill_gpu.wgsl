// Prefill attention on GPUs: the kernel of attention_prefill.wgsl, which it follows. Keys in
// tiles of TILE_KEYS through workgroup memory, shared by a run's rows.

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
                    k = cached_key(index);
                    v = cached_value(index);
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
