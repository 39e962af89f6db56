// Decode attention over a paged KV cache: one query row per sequence, at position
// context_lens[s] - 1, attending to keys 0 .. context_lens[s] of that sequence (the last `window`
// of them with a sliding window). Follows attention.wgsl.
//
// Layout: q and out [n_seqs, n_heads, HEAD_DIM] f32; context_lens u32 [n_seqs]; block_table
// u32 [n_seqs, max_blocks_per_seq]; k_cache, v_cache as in attention.wgsl.
// Workgroup: WG invocations per (sequence, kv head, chunk of GROUP_HEADS of the query heads that
// share that kv head), linear index (seq * n_kv_heads + kv_head) * chunks + chunk on a 1-D or
// 2-D grid, so each key and value is read once for all the chunk's heads. Keys are walked in
// tiles of WG: invocation t scores key t of the tile against every head (full dot products with
// the queries, which sit in workgroup memory); then invocation (key group g, vec4 c) folds vec4 c
// of the values of keys g, g + KEY_GROUPS, ... into each head's accumulator, with each head's
// running maximum and sum (online softmax). Two barriers per tile; the key groups' partial sums
// meet in workgroup memory at the end. Context length is bounded only by the block table.
// A context of 0 keys writes zeros; a context longer than the block table row is clamped to it.
// Defines: HEAD_DIM, WG, GROUP_HEADS (a divisor of n_heads / n_kv_heads).
// Bounds: HEAD_DIM a multiple of 4 and at most 4 * WG.
//
// SERIAL (for CPU devices such as lavapipe, where invocations are SIMD lanes of one thread and
// barriers and workgroup memory are costly): one invocation per (sequence, kv head, chunk of
// GROUP_HEADS query heads), linear index wg.x + wg.y * num_workgroups.x times WG plus the lane,
// walks the sequence's keys alone, loading each key and value once for the chunk's heads, each
// head with its own online softmax; no workgroup memory, no barrier.

@group(0) @binding(0) var<uniform> params: AttentionParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> context_lens: array<u32>;
@group(0) @binding(5) var<storage, read> block_table: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;

#if SERIAL
@compute @workgroup_size(WG)
fn attention_decode(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let chunks = params.n_heads / params.n_kv_heads / GROUP_HEADS;
    let group = (wg.x + wg.y * groups.x) * WG + lane;
    if group >= params.n_rows * params.n_kv_heads * chunks {
        return;
    }
    let seq = group / (params.n_kv_heads * chunks);
    let kv_head = group / chunks % params.n_kv_heads;
    // Query row (seq, head) of the chunk's first head: the heads of a chunk are consecutive.
    let first_row = seq * params.n_heads + kv_head * (params.n_heads / params.n_kv_heads)
        + group % chunks * GROUP_HEADS;
    var query: array<vec4<f32>, GROUP_HEADS * HEAD_VEC4S>;
    var acc: array<vec4<f32>, GROUP_HEADS * HEAD_VEC4S>;
    var running_max: array<f32, GROUP_HEADS>;
    var sum: array<f32, GROUP_HEADS>;
    for (var e = 0u; e < GROUP_HEADS * HEAD_VEC4S; e++) {
        query[e] = q[first_row * HEAD_VEC4S + e] * params.scale;
    }
    for (var h = 0u; h < GROUP_HEADS; h++) {
        running_max[h] = NO_MAX;
    }
    let n_keys = min(context_lens[seq], table_capacity());
    let first = select(0u, first_visible_key(n_keys - 1u), n_keys > 0u);
    for (var key = first; key < n_keys; key++) {
        let base = cache_vec4_index(key_slot(seq, key), kv_head);
        // Each key and value is loaded once for the chunk's heads.
        var k: array<vec4<f32>, HEAD_VEC4S>;
        for (var i = 0u; i < HEAD_VEC4S; i++) {
            k[i] = k_cache[base + i];
        }
        var p: array<f32, GROUP_HEADS>;
        for (var h = 0u; h < GROUP_HEADS; h++) {
            var score = 0.0;
            for (var i = 0u; i < HEAD_VEC4S; i++) {
                score += dot(query[h * HEAD_VEC4S + i], k[i]);
            }
            score = soft_cap(score);
            // Rescale only when the maximum moves, which after the first keys is rare.
            if score > running_max[h] {
                let rescale = exp(running_max[h] - score);
                sum[h] *= rescale;
                for (var i = 0u; i < HEAD_VEC4S; i++) {
                    acc[h * HEAD_VEC4S + i] *= rescale;
                }
                running_max[h] = score;
            }
            p[h] = exp(score - running_max[h]);
            sum[h] += p[h];
        }
        for (var i = 0u; i < HEAD_VEC4S; i++) {
            let v = v_cache[base + i];
            for (var h = 0u; h < GROUP_HEADS; h++) {
                acc[h * HEAD_VEC4S + i] += p[h] * v;
            }
        }
    }
    for (var e = 0u; e < GROUP_HEADS * HEAD_VEC4S; e++) {
        // The key at the running maximum contributes exp(0) = 1: the sum is 0 only with no keys.
        let total = sum[e / HEAD_VEC4S];
        out[first_row * HEAD_VEC4S + e] = select(vec4<f32>(0.0), acc[e] / total, total > 0.0);
    }
}
#else
const KEY_GROUPS: u32 = WG / HEAD_VEC4S;

// The chunk's scaled queries, [GROUP_HEADS, HEAD_VEC4S]; after the last tile, reused for the
// key groups' accumulators, [KEY_GROUPS, GROUP_HEADS, HEAD_VEC4S].
var<workgroup> head_vec4s: array<vec4<f32>, KEY_GROUPS * GROUP_HEADS * HEAD_VEC4S>;
// [GROUP_HEADS, WG]: the tile's scores, then their probabilities.
var<workgroup> tile_scores: array<f32, GROUP_HEADS * WG>;
var<workgroup> tile_probs: array<f32, GROUP_HEADS * WG>;
var<workgroup> tile_slots: array<u32, WG>;
// [KEY_GROUPS, GROUP_HEADS]: the key groups' softmax denominators.
var<workgroup> group_sums: array<f32, KEY_GROUPS * GROUP_HEADS>;
// (first visible key, one past the last), shared so that the loop bounds are uniform.
var<workgroup> key_range: vec2<u32>;

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
    // Query row (seq, head) of the chunk's first head: the heads of a chunk are consecutive.
    let first_row = seq * params.n_heads + kv_head * (params.n_heads / params.n_kv_heads)
        + group % chunks * GROUP_HEADS;

    for (var e = lane; e < GROUP_HEADS * HEAD_VEC4S; e += WG) {
        head_vec4s[e] = q[first_row * HEAD_VEC4S + e] * params.scale;
    }
    if lane == 0u {
        let n_keys = min(context_lens[seq], table_capacity());
        key_range = vec2<u32>(select(0u, first_visible_key(n_keys - 1u), n_keys > 0u), n_keys);
    }
    // Also the barrier that publishes the queries.
    let keys = workgroupUniformLoad(&key_range);

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
        if lane < tile_len {
            slot = key_slot(seq, tile + lane);
            let base = cache_vec4_index(slot, kv_head);
            for (var i = 0u; i < HEAD_VEC4S; i++) {
                let k = k_cache[base + i];
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
                let v = v_cache[cache_vec4_index(tile_slots[i], kv_head) + c];
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
        // The key at the running maximum contributes exp(0) = 1: the sum is 0 only with no keys.
        out[first_row * HEAD_VEC4S + e] = select(vec4<f32>(0.0), total / sum, sum > 0.0);
    }
}
#endif
