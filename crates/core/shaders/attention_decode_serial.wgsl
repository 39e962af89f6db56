// Decode attention on CPU devices: the serial kernel of attention_decode.wgsl, which it follows
// (with attention_serial.wgsl).
//
// For CPU devices such as lavapipe, where invocations are SIMD lanes of one thread and a
// private array indexed in a loop too long to unroll lives in memory, indexed per lane: WG
// lanes per (sequence, kv head, chunk), which must lie in one subgroup. The heads are prepared
// as attention_decode.wgsl says; then each lane keeps only its vec4s of them, lane, lane + WG,
// ..., and the keys are walked one at a time by all lanes together: each lane loads its vec4s
// of the key and the value, a subgroupAdd makes the scores, and the online softmax (the same in
// every lane) has no branch and no barrier. The loop over cached keys has no branch for the
// new key, which comes after it: on lavapipe one made decode attention half as slow again.

const HEAD_SLOTS: u32 = GROUP_HEADS * HEAD_VEC4S;

// A key's weight for each of the chunk's heads, and the factor by which the head's accumulator
// and sum are rescaled as its maximum moves to the key's score (1 when it stays).
struct KeyWeights {
    p: array<f32, GROUP_HEADS>,
    rescale: array<f32, GROUP_HEADS>,
}

// Scores the key whose vec4s of this lane are `k` against each of the chunk's queries (of which
// the lane holds the same vec4s) and moves each head's online softmax on to it. Every lane
// gets the same scores, so all agree on the weights.
fn score_key(
    query: ptr<function, array<vec4<f32>, GROUP_HEADS * LANE_VEC4S>>,
    k: ptr<function, array<vec4<f32>, LANE_VEC4S>>,
    running_max: ptr<function, array<f32, GROUP_HEADS>>,
    sum: ptr<function, array<f32, GROUP_HEADS>>,
) -> KeyWeights {
    var weights: KeyWeights;
    for (var h = 0u; h < GROUP_HEADS; h++) {
        var partial = 0.0;
        for (var j = 0u; j < LANE_VEC4S; j++) {
            partial += dot((*query)[h * LANE_VEC4S + j], (*k)[j]);
        }
        let step = softmax_step((*running_max)[h], (*sum)[h], soft_cap(subgroupAdd(partial)), true);
        (*running_max)[h] = step.x;
        (*sum)[h] = step.y;
        weights.rescale[h] = step.z;
        weights.p[h] = step.w;
    }
    return weights;
}

@compute @workgroup_size(WG)
fn attention_decode(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let chunks = params.n_heads / params.n_kv_heads / GROUP_HEADS;
    let group = wg.x + wg.y * groups.x;
    if group >= params.n_rows * params.n_kv_heads * chunks {
        return;
    }
    let seq = group / (params.n_kv_heads * chunks);
    let kv_head = group / chunks % params.n_kv_heads;
    let first_row = chunk_first_row(seq, kv_head, group, chunks);
    let keys = prepare_heads(lane, seq, kv_head, first_row, 0u, group % chunks == 0u);
    let position = context_lens[seq] - 1u;
    let new_row = new_vec4_index(seq, kv_head);

    var query: array<vec4<f32>, GROUP_HEADS * LANE_VEC4S>;
    var fresh_key: array<vec4<f32>, LANE_VEC4S>;
    for (var j = 0u; j < LANE_VEC4S; j++) {
        let inside = lane + j * WG < HEAD_VEC4S;
        fresh_key[j] = new_key[lane_vec4(lane, j)];
        for (var h = 0u; h < GROUP_HEADS; h++) {
            query[h * LANE_VEC4S + j] = select(vec4<f32>(0.0), head_vec4s[h * HEAD_VEC4S + lane_vec4(lane, j)], inside);
        }
    }
    var acc: array<vec4<f32>, GROUP_HEADS * LANE_VEC4S>;
    var running_max: array<f32, GROUP_HEADS>;
    var sum: array<f32, GROUP_HEADS>;
    for (var h = 0u; h < GROUP_HEADS; h++) {
        running_max[h] = NO_MAX;
    }
    // The cached keys, then the new one: the last, unless the context is clamped.
    for (var key = keys.x; key < min(keys.y, position); key++) {
        let base = cache_vec4_index(key_slot(seq, key), kv_head);
        var k: array<vec4<f32>, LANE_VEC4S>;
        for (var j = 0u; j < LANE_VEC4S; j++) {
            k[j] = cached_key(base + lane_vec4(lane, j));
        }
        let w = score_key(&query, &k, &running_max, &sum);
        for (var j = 0u; j < LANE_VEC4S; j++) {
            let v = cached_value(base + lane_vec4(lane, j));
            for (var h = 0u; h < GROUP_HEADS; h++) {
                acc[h * LANE_VEC4S + j] = acc[h * LANE_VEC4S + j] * w.rescale[h] + w.p[h] * v;
            }
        }
    }
    if position < keys.y {
        let w = score_key(&query, &fresh_key, &running_max, &sum);
        for (var j = 0u; j < LANE_VEC4S; j++) {
            let v = as_cached(v_new[new_row + lane_vec4(lane, j)]);
            for (var h = 0u; h < GROUP_HEADS; h++) {
                acc[h * LANE_VEC4S + j] = acc[h * LANE_VEC4S + j] * w.rescale[h] + w.p[h] * v;
            }
        }
    }
    for (var h = 0u; h < GROUP_HEADS; h++) {
        for (var j = 0u; j < LANE_VEC4S; j++) {
            let c = lane + j * WG;
            if c < HEAD_VEC4S {
                // The key at the running maximum contributes exp(0) = 1: the sum is 0 only with
                // no keys.
                out[(first_row + h) * HEAD_VEC4S + c] =
                    select(vec4<f32>(0.0), acc[h * LANE_VEC4S + j] / sum[h], sum[h] > 0.0);
            }
        }
    }
}
