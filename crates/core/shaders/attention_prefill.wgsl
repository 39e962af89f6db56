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
// The kernel itself follows this file: attention_prefill_gpu.wgsl (as described here) or
// attention_prefill_serial.wgsl (CPU devices).

@group(0) @binding(0) var<uniform> params: AttentionParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
// KV_TEXTURES (serial kernel): the cache's keys and values copied into textures, read instead
// of the buffers (see cached_key in attention.wgsl).
#if KV_TEXTURES
@group(0) @binding(2) var k_texture: texture_storage_2d<rgba32uint, read>;
@group(0) @binding(3) var v_texture: texture_storage_2d<rgba32uint, read>;
#else
@group(0) @binding(2) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec2<u32>>;
#endif
@group(0) @binding(4) var<storage, read> seq_ids: array<u32>;
@group(0) @binding(5) var<storage, read> positions: array<u32>;
@group(0) @binding(6) var<storage, read> block_table: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<vec4<f32>>;
