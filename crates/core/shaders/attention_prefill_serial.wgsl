// Prefill attention on CPU devices: the serial kernel of attention_prefill.wgsl, which it
// follows (with attention_serial.wgsl).
//
// For CPU devices such as lavapipe (see attention_decode_serial.wgsl): WG lanes in one
// subgroup per (tile of ROWS consecutive tokens, kv head, chunk of GROUP_HEADS of its query
// heads), linear index (tile * n_kv_heads + kv_head) * chunks + chunk. The lanes split each head's
// dims (vec4s lane, lane + WG, ...) and walk the keys together, one at a time, each key and value
// loaded once for the tile's rows and heads; a subgroupAdd makes each score. No workgroup memory,
// no barrier. The tile's rows are split into runs of one sequence as in attention_prefill.wgsl.
// Defines: HEAD_DIM, ROWS, WG, GROUP_HEADS (a divisor of n_heads / n_kv_heads).

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
