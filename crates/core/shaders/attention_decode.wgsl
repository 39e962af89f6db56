// Decode attention over a paged KV cache: one new token per sequence, at position
// context_lens[s] - 1, attending to keys 0 .. context_lens[s] of that sequence (the last `window`
// of them with a sliding window), its own included. Follows rope_common.wgsl and attention.wgsl.
//
// The new token arrives as its projections: its query heads are normalised (HEAD_NORMS: an
// RMSNorm per head), rotated (rope) and scaled here; its key likewise, unscaled; its key and
// value are written to the token's cache slot for later steps. This dispatch never reads that
// slot: every workgroup (or invocation) that needs the new key computes it from k_new itself and
// takes the new value from v_new (each rounded to f16 as the cache holds it), since another one
// writes the slot with no ordering between them. Exactly one, the first chunk of each (sequence, kv head), writes it.
//
// Layout: q and out [n_seqs, n_heads, HEAD_DIM] f32; k_new and v_new [n_seqs, n_kv_heads,
// HEAD_DIM] f32; context_lens u32 [n_seqs]; block_table u32 [n_seqs, max_blocks_per_seq];
// k_cache, v_cache as in attention.wgsl; head_constants: see HeadConstants.
// Workgroup: WG invocations per (sequence, kv head, chunk of GROUP_HEADS of the query heads that
// share that kv head), linear index (seq * n_kv_heads + kv_head) * chunks + chunk on a 1-D or
// 2-D grid, so each key and value is read once for all the chunk's heads. The chunk's query
// heads and the new key are loaded into workgroup memory, normalised (one invocation per head
// sums its squares) and rotated (one invocation per pair of dims). Keys are walked in tiles of
// WG: invocation t scores key t of the tile against every head (full dot products with the
// queries, which sit in workgroup memory); then invocation (key group g, vec4 c) folds vec4 c
// of the values of keys g, g + KEY_GROUPS, ... into each head's accumulator, with each head's
// running maximum and sum (online softmax). Two barriers per tile; the key groups' partial sums
// meet in workgroup memory at the end. Context length is bounded only by the block table.
// A context of 0 keys writes zeros; a context longer than the block table row is clamped to it
// (and the new token, past the row, is neither seen nor stored).
// Defines: HEAD_DIM, ROT_PAIRS, NEOX, HEAD_NORMS, WG, GROUP_HEADS (a divisor of
// n_heads / n_kv_heads).
// The kernel itself follows this file: attention_decode_gpu.wgsl (keys in tiles through
// workgroup memory, as described here) or attention_decode_serial.wgsl (CPU devices); each
// defines HEAD_SLOTS, the size of head_vec4s.
// Bounds: HEAD_DIM a multiple of 4, and (on GPUs) at most 4 * WG.
//
// SPLIT (flash-decoding, for GPUs when the (sequence, kv head, chunk) groups are too few to fill
// the device): each group's keys are cut into spans of params.key_span, one workgroup per span
// (linear index group * params.splits + split). Each writes, instead of the result, its
// unnormalised accumulators and each head's running maximum and sum into `out`, which is then
// the partials buffer of attention_combine.wgsl: accumulators [groups, splits, GROUP_HEADS,
// HEAD_VEC4S] vec4s, then per (group, split, head) a vec4 (maximum, sum, 0, 0). Only split 0
// stores the new key and value.

// Per rotated pair its turn (rope_common.wgsl), then with HEAD_NORMS the norms' weights (with
// their convention applied: w, or 1 + w) and eps. Built once per layer. A uniform, because the
// kernel already binds 8 storage buffers, WebGPU's default limit per shader stage.
struct HeadConstants {
    turns: array<vec4<u32>, (ROT_PAIRS + 3u) / 4u>,
#if HEAD_NORMS
    q_scale: array<vec4<f32>, HEAD_VEC4S>,
    k_scale: array<vec4<f32>, HEAD_VEC4S>,
    eps: f32,
#endif
}

@group(0) @binding(0) var<uniform> params: AttentionParams;
@group(0) @binding(1) var<uniform> head_constants: HeadConstants;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_new: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> v_new: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read> context_lens: array<u32>;
@group(0) @binding(8) var<storage, read> block_table: array<u32>;
@group(0) @binding(9) var<storage, read_write> out: array<vec4<f32>>;
// KV_TEXTURES (serial kernel): see cached_key in attention.wgsl.
#if KV_TEXTURES
@group(0) @binding(10) var k_texture: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(11) var v_texture: texture_storage_2d<rgba32uint, read>;
#endif

const HALF_DIM: u32 = HEAD_DIM / 2u;

fn pair_turn(pair: u32) -> u32 {
    return head_constants.turns[pair / 4u][pair % 4u];
}

// The two dims of a head that work item `j` (of HALF_DIM) transforms: rotation pair j, or past
// the rotated pairs two dims that are only normalised.
fn pair_dims(j: u32) -> vec2<u32> {
#if NEOX
    if j < ROT_PAIRS {
        return vec2<u32>(j, j + ROT_PAIRS);
    }
#endif
    return vec2<u32>(2u * j, 2u * j + 1u);
}

// 1 / rms of a head whose sum of squares is `sum_squares` (HEAD_NORMS).
fn head_inverse_rms(sum_squares: f32) -> f32 {
#if HEAD_NORMS
    return inverseSqrt(sum_squares / f32(HEAD_DIM) + head_constants.eps);
#else
    return 1.0;
#endif
}

// Dims `dims` (from pair_dims(j)) of a query or key head, `x`, normalised with the head's
// `inv_rms` and rotated to `position`: the same operations, in the same order, as rms_norm then
// rope_kv.
fn transform_pair(
    x: vec2<f32>,
    j: u32,
    dims: vec2<u32>,
    is_key: bool,
    inv_rms: f32,
    position: u32,
) -> vec2<f32> {
    var y = x;
#if HEAD_NORMS
    let q_scale = vec2<f32>(head_constants.q_scale[dims.x / 4u][dims.x % 4u],
                            head_constants.q_scale[dims.y / 4u][dims.y % 4u]);
    let k_scale = vec2<f32>(head_constants.k_scale[dims.x / 4u][dims.x % 4u],
                            head_constants.k_scale[dims.y / 4u][dims.y % 4u]);
    y = y * inv_rms * select(q_scale, k_scale, is_key);
#endif
    if j < ROT_PAIRS {
        y = rotate(y, rotation(position, j));
    }
    return y;
}

// The first vec4 of (sequence, kv head) in k_new and v_new.
fn new_vec4_index(seq: u32, kv_head: u32) -> u32 {
    return (seq * params.n_kv_heads + kv_head) * HEAD_VEC4S;
}

// The chunk's scaled queries, [GROUP_HEADS, HEAD_VEC4S].
var<workgroup> head_vec4s: array<vec4<f32>, HEAD_SLOTS>;
// The new token's key, normalised, rotated and rounded as the cache stores it.
var<workgroup> new_key: array<vec4<f32>, HEAD_VEC4S>;
#if HEAD_NORMS
// 1 / rms of the chunk's query heads, then of the new key.
var<workgroup> head_inv_rms: array<f32, GROUP_HEADS + 1u>;
#endif
// (first visible key, one past the last), shared so that the loop bounds are uniform.
var<workgroup> key_range: vec2<u32>;

// Loads the chunk's query heads (rows first_row ..) and the new key of (seq, kv_head) into
// workgroup memory, normalised and rotated, the queries scaled; stores the new key and value in
// the cache when `stores_new_key`. Returns the range of keys to visit: those the new token sees
// (with SPLIT, within span `split`).
fn prepare_heads(
    lane: u32,
    seq: u32,
    kv_head: u32,
    first_row: u32,
    split: u32,
    stores_new_key: bool,
) -> vec2<u32> {
    let context_len = context_lens[seq];
    // With no context, past every key.
    let position = context_len - 1u;
    let new_row = new_vec4_index(seq, kv_head);
    for (var e = lane; e < GROUP_HEADS * HEAD_VEC4S; e += WG) {
        head_vec4s[e] = q[first_row * HEAD_VEC4S + e];
    }
    for (var i = lane; i < HEAD_VEC4S; i += WG) {
        new_key[i] = k_new[new_row + i];
    }
    if lane == 0u {
        let n_keys = min(context_len, table_capacity());
        key_range = vec2<u32>(select(0u, first_visible_key(n_keys - 1u), n_keys > 0u), n_keys);
#if SPLIT
        // This workgroup's span of them; it may be empty.
        key_range = vec2<u32>(max(key_range.x, split * params.key_span),
                              min(key_range.y, (split + 1u) * params.key_span));
#endif
    }
    workgroupBarrier();
#if HEAD_NORMS
    // One invocation per head sums its squares: the chunk's query heads, then the new key.
    for (var h = lane; h <= GROUP_HEADS; h += WG) {
        var squares = 0.0;
        for (var i = 0u; i < HEAD_VEC4S; i++) {
            var x: vec4<f32>;
            if h < GROUP_HEADS {
                x = head_vec4s[h * HEAD_VEC4S + i];
            } else {
                x = new_key[i];
            }
            squares += dot(x, x);
        }
        head_inv_rms[h] = head_inverse_rms(squares);
    }
    workgroupBarrier();
#endif
    // One invocation per pair of dims of a head: the chunk's query heads, then the new key.
    for (var item = lane; item < (GROUP_HEADS + 1u) * HALF_DIM; item += WG) {
        let h = item / HALF_DIM;
        let j = item % HALF_DIM;
        let d = pair_dims(j);
#if HEAD_NORMS
        let inv_rms = head_inv_rms[h];
#else
        let inv_rms = 1.0;
#endif
        if h < GROUP_HEADS {
            let a = h * HEAD_DIM + d.x;
            let b = h * HEAD_DIM + d.y;
            let x = vec2<f32>(head_vec4s[a / 4u][a % 4u], head_vec4s[b / 4u][b % 4u]);
            let y = transform_pair(x, j, d, false, inv_rms, position) * params.scale;
            head_vec4s[a / 4u][a % 4u] = y.x;
            head_vec4s[b / 4u][b % 4u] = y.y;
        } else {
            let x = vec2<f32>(new_key[d.x / 4u][d.x % 4u], new_key[d.y / 4u][d.y % 4u]);
            let y = unpack2x16float(pack2x16float(transform_pair(x, j, d, true, inv_rms, position)));
            new_key[d.x / 4u][d.x % 4u] = y.x;
            new_key[d.y / 4u][d.y % 4u] = y.y;
        }
    }
    // Also the barrier that publishes the queries and the new key.
    let keys = workgroupUniformLoad(&key_range);
    if stores_new_key && position < table_capacity() {
        let base = cache_vec4_index(key_slot(seq, position), kv_head);
        for (var i = lane; i < HEAD_VEC4S; i += WG) {
            k_cache[base + i] = pack_halves(new_key[i]);
            v_cache[base + i] = pack_halves(v_new[new_row + i]);
        }
    }
    return keys;
}

// The first query row of the chunk of linear index `group` (seq, kv head, chunk): the heads of
// a chunk are consecutive.
fn chunk_first_row(seq: u32, kv_head: u32, group: u32, chunks: u32) -> u32 {
    return seq * params.n_heads + kv_head * (params.n_heads / params.n_kv_heads) + group % chunks * GROUP_HEADS;
}
