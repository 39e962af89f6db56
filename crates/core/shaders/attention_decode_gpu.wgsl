// Decode attention on GPUs: the kernel of attention_decode.wgsl, which it follows (with SPLIT,
// flash-decoding as described there). Keys in tiles of WG through workgroup memory.

const KEY_GROUPS: u32 = WG / HEAD_VEC4S;
// The chunk's queries; after the last tile, reused for the key groups' accumulators.
const HEAD_SLOTS: u32 = KEY_GROUPS * GROUP_HEADS * HEAD_VEC4S;

// tile_slots' mark for the new key, which is read from new_key and v_new, not the cache.
const FRESH_SLOT: u32 = 0xffffffffu;

// [GROUP_HEADS, WG]: the tile's scores, then their probabilities.
var<workgroup> tile_scores: array<f32, GROUP_HEADS * WG>;
var<workgroup> tile_probs: array<f32, GROUP_HEADS * WG>;
var<workgroup> tile_slots: array<u32, WG>;
// [KEY_GROUPS, GROUP_HEADS]: the key groups' softmax denominators.
var<workgroup> group_sums: array<f32, KEY_GROUPS * GROUP_HEADS>;
@compute @workgroup_size(WG)
fn attention_decode(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let chunks = params.n_heads / params.n_kv_heads / GROUP_HEADS;
    let workgroup = wg.x + wg.y * groups.x;
#if SPLIT
    let group = workgroup / params.splits;
    let split = workgroup % params.splits;
    let stores_new_key = group % chunks == 0u && split == 0u;
#else
    let group = workgroup;
    let stores_new_key = group % chunks == 0u;
#endif
    if group >= params.n_rows * params.n_kv_heads * chunks {
        return;
    }
    let seq = group / (params.n_kv_heads * chunks);
    let kv_head = group / chunks % params.n_kv_heads;
    let first_row = chunk_first_row(seq, kv_head, group, chunks);
#if SPLIT
    let keys = prepare_heads(lane, seq, kv_head, first_row, split, stores_new_key);
#else
    let keys = prepare_heads(lane, seq, kv_head, first_row, 0u, stores_new_key);
#endif
    let position = context_lens[seq] - 1u;
    let new_row = new_vec4_index(seq, kv_head);

    let key_group = lane / HEAD_VEC4S;
    let c = lane % HEAD_VEC4S;
    let folds = key_group < KEY_GROUPS;
    var running_max: array<f32, GROUP_HEADS>;
    var running_sum: array<f32, GROUP_HEADS>;
    var acc: array<vec4<f32>, GROUP_HEADS>;
    for (var h = 0u; h < GROUP_HEADS; h++) {
        running_max[h] = NO_MAX;
    }
    for (var tile = keys.x; tile < keys.y; tile += WG) {
        let tile_len = min(WG, keys.y - tile);
        var slot = 0u;
        var scores: array<f32, GROUP_HEADS>;
        if lane < tile_len && tile + lane == position {
            slot = FRESH_SLOT;
            for (var i = 0u; i < HEAD_VEC4S; i++) {
                for (var h = 0u; h < GROUP_HEADS; h++) {
                    scores[h] += dot(head_vec4s[h * HEAD_VEC4S + i], new_key[i]);
                }
            }
        } else if lane < tile_len {
            slot = key_slot(seq, tile + lane);
            let base = cache_vec4_index(slot, kv_head);
            for (var i = 0u; i < HEAD_VEC4S; i++) {
                let k = cached_key(base + i);
                for (var h = 0u; h < GROUP_HEADS; h++) {
                    scores[h] += dot(head_vec4s[h * HEAD_VEC4S + i], k);
                }
            }
        }
        for (var h = 0u; h < GROUP_HEADS; h++) {
            tile_scores[h * WG + lane] = soft_cap(scores[h]);
        }
        workgroupBarrier();

        // Every invocation takes the same maxima, so all agree on the rescaling.
        for (var h = 0u; h < GROUP_HEADS; h++) {
            var tile_max = NO_MAX;
            for (var i = 0u; i < tile_len; i++) {
                tile_max = max(tile_max, tile_scores[h * WG + i]);
            }
            let new_max = max(running_max[h], tile_max);
            let p = exp(tile_scores[h * WG + lane] - new_max);
            tile_probs[h * WG + lane] = select(0.0, p, lane < tile_len);
            let rescale = exp(running_max[h] - new_max);
            running_sum[h] *= rescale;
            acc[h] *= rescale;
            running_max[h] = new_max;
        }
        tile_slots[lane] = slot;
        workgroupBarrier();

        // The next tile writes tile_scores only before its first barrier, so no third barrier.
        if folds {
            for (var i = key_group; i < tile_len; i += KEY_GROUPS) {
                var v: vec4<f32>;
                if tile_slots[i] == FRESH_SLOT {
                    v = as_cached(v_new[new_row + c]);
                } else {
                    v = cached_value(cache_vec4_index(tile_slots[i], kv_head) + c);
                }
                for (var h = 0u; h < GROUP_HEADS; h++) {
                    let p = tile_probs[h * WG + i];
                    running_sum[h] += p;
                    acc[h] += p * v;
                }
            }
        }
    }

    // Every invocation is past its last read of the queries: their memory takes the partial sums.
    if folds {
        for (var h = 0u; h < GROUP_HEADS; h++) {
            head_vec4s[(key_group * GROUP_HEADS + h) * HEAD_VEC4S + c] = acc[h];
            if c == 0u {
                group_sums[key_group * GROUP_HEADS + h] = running_sum[h];
            }
        }
    }
    workgroupBarrier();
    for (var e = lane; e < GROUP_HEADS * HEAD_VEC4S; e += WG) {
        let h = e / HEAD_VEC4S;
        var total = vec4<f32>(0.0);
        var sum = 0.0;
        for (var g = 0u; g < KEY_GROUPS; g++) {
            total += head_vec4s[g * GROUP_HEADS * HEAD_VEC4S + e];
            sum += group_sums[g * GROUP_HEADS + h];
        }
#if SPLIT
        // Every invocation holds the same maxima. The combine rescales and divides.
        let partial = group * params.splits + split;
        out[partial * GROUP_HEADS * HEAD_VEC4S + e] = total;
        if e % HEAD_VEC4S == 0u {
            let stats = params.n_rows * params.n_kv_heads * chunks * params.splits * GROUP_HEADS * HEAD_VEC4S;
            out[stats + partial * GROUP_HEADS + h] = vec4<f32>(running_max[h], sum, 0.0, 0.0);
        }
#else
        // The key at the running maximum contributes exp(0) = 1: the sum is 0 only with no keys.
        out[first_row * HEAD_VEC4S + e] = select(vec4<f32>(0.0), total / sum, sum > 0.0);
#endif
    }
}
