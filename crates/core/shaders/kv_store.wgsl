// Writes the keys and values of new tokens into a paged KV cache (layout in attention.wgsl).
// Follows kv_halves.wgsl.
//
// Layout: k_new and v_new [n_tokens, n_kv_heads * head_dim] f32, read as vec4; slots u32
// [n_tokens], the cache slot (block * block_size + offset) of each token; k_cache and v_cache
// [num_blocks * block_size, n_kv_heads * head_dim] f16, two to a u32 word, written as vec2<u32>.
// Workgroup: WG invocations, one vec4 of one token's row each (for K and for V), linear index
// wg.x + wg.y * num_workgroups.x on a 1-D or 2-D grid.
// A token whose slot is past the cache (e.g. 0xffffffff for padding) is not stored.
// Bounds: head_dim a multiple of 4; n_tokens * n_kv_heads * head_dim / 4 below 2^32.

struct Params {
    // n_kv_heads * head_dim / 4.
    row_vec4s: u32,
    n_tokens: u32,
    // num_blocks * block_size.
    n_slots: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_new: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_new: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<vec2<u32>>;

@compute @workgroup_size(WG)
fn kv_store(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = (wg.x + wg.y * groups.x) * WG + lane;
    if i >= params.n_tokens * params.row_vec4s {
        return;
    }
    let token = i / params.row_vec4s;
    let slot = slots[token];
    if slot < params.n_slots {
        let at = slot * params.row_vec4s + i % params.row_vec4s;
        k_cache[at] = pack_halves(k_new[i]);
        v_cache[at] = pack_halves(v_new[i]);
    }
}
