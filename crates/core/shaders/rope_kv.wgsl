// The rotary position embedding of new tokens' queries and keys, and the keys and values
// stored into the paged KV cache, in one pass: rope(q) in place, then rope(k) and v written to
// the tokens' cache slots (what rope.wgsl twice and kv_store.wgsl do in three).
//
// Composed after rope_common.wgsl (the rotation; rope.wgsl says what ROT_PAIRS and NEOX mean).
// Layout: q [n_tokens, q_heads, HEAD_DIM], k and v [n_tokens, kv_heads, HEAD_DIM] f32;
//   positions and slots u32 [n_tokens]; k_cache and v_cache [slots, kv_heads * HEAD_DIM] f32
//   (the layout in attention.wgsl). A token whose slot is past the cache (0xffffffff pads a
//   batch) rotates its queries but stores nothing.
// Work items: HEAD_DIM / 2 per (token, head), heads 0 .. q_heads being query heads and the
//   next kv_heads key/value heads. Item j < ROT_PAIRS takes rotation pair j; item j >= ROT_PAIRS
//   takes the unrotated dims 2j and 2j + 1 (rotated_dims = 2 ROT_PAIRS <= HEAD_DIM). A query
//   item rotates its pair in place; a key/value item writes its two keys, rotated or not, and
//   its two values to the cache.
// Workgroup: WG_SIZE invocations, one item each; grid 1-D or 2-D
//   (index = wg.x + wg.y * num_workgroups.x); indices past the last item do nothing.

struct RopeKvParams {
    n_tokens: u32,
    q_heads: u32,
    kv_heads: u32,
    n_slots: u32,
}

@group(0) @binding(0) var<uniform> params: RopeKvParams;
@group(0) @binding(1) var<storage, read> turns: array<u32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> q: array<f32>;
@group(0) @binding(5) var<storage, read> k: array<f32>;
@group(0) @binding(6) var<storage, read> v: array<f32>;
@group(0) @binding(7) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(8) var<storage, read_write> v_cache: array<f32>;

fn pair_turn(pair: u32) -> u32 {
    return turns[pair];
}

const HALF: u32 = HEAD_DIM / 2u;

@compute @workgroup_size(WG_SIZE)
fn rope_kv(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let heads = params.q_heads + params.kv_heads;
    let i = (wg.x + wg.y * groups.x) * WG_SIZE + lane;
    if i >= params.n_tokens * heads * HALF {
        return;
    }
    let j = i % HALF;
    let token = i / HALF / heads;
    let head = i / HALF % heads;

    // The item's two dims within its head.
    var a = 2u * j;
    var b = a + 1u;
#if NEOX
    if j < ROT_PAIRS {
        a = j;
        b = j + ROT_PAIRS;
    }
#endif
    let cs = rotation(positions[token], min(j, ROT_PAIRS - 1u));
    let rotated = j < ROT_PAIRS;

    if head < params.q_heads {
        if rotated {
            let row = (token * params.q_heads + head) * HEAD_DIM;
            let pair = rotate(vec2<f32>(q[row + a], q[row + b]), cs);
            q[row + a] = pair.x;
            q[row + b] = pair.y;
        }
        return;
    }
    let slot = slots[token];
    if slot >= params.n_slots {
        return;
    }
    let kv_head = head - params.q_heads;
    let row = (token * params.kv_heads + kv_head) * HEAD_DIM;
    var key = vec2<f32>(k[row + a], k[row + b]);
    if rotated {
        key = rotate(key, cs);
    }
    let at = (slot * params.kv_heads + kv_head) * HEAD_DIM;
    k_cache[at + a] = key.x;
    k_cache[at + b] = key.y;
    v_cache[at + a] = v[row + a];
    v_cache[at + b] = v[row + b];
}
