// Pieces shared by the attention kernels over a paged KV cache (attention_decode.wgsl,
// attention_prefill.wgsl), concatenated before them, after kv_halves.wgsl.
//
// The cache of one layer: K and V, each [num_blocks, block_size, n_kv_heads, HEAD_DIM] f16,
// stored as u32 words of two halves (pack2x16float: the lower dim in the low half) and read as
// vec2<u32>, one vec4 of dims at a time (pack_halves, unpack_halves).
// Position j of sequence s lives in slot block_table[s * max_blocks_per_seq + j / block_size]
// * block_size + j % block_size. Query head h reads kv head h / (n_heads / n_kv_heads).
// A query at position p sees the keys at positions j <= p with p - j < window (window 0 = all).
// Each kernel file declares the globals used here: `params: AttentionParams` (uniform) and
// `block_table: array<u32>` ([n_seqs, max_blocks_per_seq]).

struct AttentionParams {
    // Query rows: sequences for decode, tokens for prefill.
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    // Rows of the block table.
    n_seqs: u32,
    block_size: u32,
    max_blocks_per_seq: u32,
    // Sliding window in tokens; 0 = off.
    window: u32,
    // Multiplies q.k; folded into q when it is loaded.
    scale: f32,
    // Logit soft-cap: logit = softcap * tanh(logit / softcap); 0 = off.
    softcap: f32,
    // Decode split over the keys (SPLIT): keys per workgroup, and workgroups per chunk of heads.
    key_span: u32,
    splits: u32,
    _pad: u32,
}

const HEAD_VEC4S: u32 = HEAD_DIM / 4u;

// The running maximum before any key is seen. A finite stand-in for -infinity: drivers may
// compile with fast math that assumes no infinities, and exp(NO_MAX - m) is still exactly 0.
const NO_MAX: f32 = -3.0e38;

// The kv head read by query head `head` (grouped-query attention).
fn kv_head_of(head: u32) -> u32 {
    return head / (params.n_heads / params.n_kv_heads);
}

// The first key position visible from query position `position` under the sliding window.
fn first_visible_key(position: u32) -> u32 {
    if params.window != 0u && position + 1u > params.window {
        return position + 1u - params.window;
    }
    return 0u;
}

// Keys a sequence's block table row can address: larger positions are clamped to this.
fn table_capacity() -> u32 {
    return params.max_blocks_per_seq * params.block_size;
}

// The cache slot holding position `position` of sequence `seq`.
fn key_slot(seq: u32, position: u32) -> u32 {
    let block = block_table[seq * params.max_blocks_per_seq + position / params.block_size];
    return block * params.block_size + position % params.block_size;
}

// Index of the first vec4 of (slot, kv_head) in K or V.
fn cache_vec4_index(slot: u32, kv_head: u32) -> u32 {
    return (slot * params.n_kv_heads + kv_head) * HEAD_VEC4S;
}

// Applies the soft-cap to a scaled logit. tanh is written out with exp(-2|x|) so that large
// logits saturate to +-1 instead of overflowing into inf / inf.
fn soft_cap(logit: f32) -> f32 {
    if params.softcap == 0.0 {
        return logit;
    }
    let x = logit / params.softcap;
    let e = exp(-2.0 * abs(x));
    return params.softcap * sign(x) * (1.0 - e) / (1.0 + e);
}

// The cached key and value vec4 i. KV_TEXTURES (serial kernels): from the kernel's k_texture and
// v_texture, rgba32uint textures TEXTURE_WIDTH texels wide into which the cache was copied before
// the dispatch, vec4s 2t and 2t + 1 in texel t (a texture load is a gather on lavapipe, a storage
// load a loop over the lanes); decode never reads its new key from the cache, so the copy has
// every key it reads. Otherwise from k_cache and v_cache.
#if KV_TEXTURES
fn texel_halves(texel: vec4<u32>, i: u32) -> vec4<f32> {
    return unpack_halves(select(texel.xy, texel.zw, (i & 1u) == 1u));
}

fn texel(i: u32) -> vec2<u32> {
    let t = i / 2u;
    return vec2<u32>(t % TEXTURE_WIDTH, t / TEXTURE_WIDTH);
}

fn cached_key(i: u32) -> vec4<f32> {
    return texel_halves(textureLoad(k_texture, texel(i)), i);
}

fn cached_value(i: u32) -> vec4<f32> {
    return texel_halves(textureLoad(v_texture, texel(i)), i);
}
#else
fn cached_key(i: u32) -> vec4<f32> {
    return unpack_halves(k_cache[i]);
}

fn cached_value(i: u32) -> vec4<f32> {
    return unpack_halves(v_cache[i]);
}
#endif
