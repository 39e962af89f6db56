// The rotary position embedding of new tokens' queries and keys, and the keys and values
// stored into the paged KV cache, in one pass: rope(q) in place, then rope(k) and v written to
// the tokens' cache slots (what rope.wgsl twice and kv_store.wgsl do in three).
//
// Composed after rope_common.wgsl (the rotation; rope.wgsl says what ROT_PAIRS and NEOX mean).
// Layout: q [n_tokens, q_heads, HEAD_DIM], k and v [n_tokens, kv_heads, HEAD_DIM] f32;
//   positions and slots u32 [n_tokens]; k_cache and v_cache [slots, kv_heads * HEAD_DIM] f16,
//   two to a u32 word (the layout in attention.wgsl). A token whose slot is past the cache
//   (0xffffffff pads a batch) rotates its queries but stores nothing.
// Work items: HEAD_DIM / 2 per (token, head), heads 0 .. q_heads being query heads and the
//   next kv_heads key/value heads. A query item j rotates pair j in place when j < ROT_PAIRS
//   (rotated_dims = 2 ROT_PAIRS <= HEAD_DIM). A key/value item j writes cache word j of its
//   head, dims 2j and 2j + 1 of the rotated key and of the value: in the NeoX layout those
//   dims belong to two rotation pairs, so an item computes the rotation of each dim it writes
//   (no two items write the same word).
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
@group(0) @binding(7) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(8) var<storage, read_write> v_cache: array<u32>;

fn pair_turn(pair: u32) -> u32 {
    return turns[pair];
}

const HALF: u32 = HEAD_DIM / 2u;

// Rotation pair j's two dims within a head.
fn pair_dims(j: u32) -> vec2<u32> {
#if NEOX
    return vec2<u32>(j, j + ROT_PAIRS);
#else
    return vec2<u32>(2u * j, 2u * j + 1u);
#endif
}

// The rotation pair holding dim d (d < 2 ROT_PAIRS).
fn pair_of_dim(d: u32) -> u32 {
#if NEOX
    return d % ROT_PAIRS;
#else
    return d / 2u;
#endif
}

// Dim d of the key head starting at k[row], rotated to `position` when d is a rotated dim.
fn rotated_key_dim(row: u32, d: u32, position: u32) -> f32 {
    if d >= 2u * ROT_PAIRS {
        return k[row + d];
    }
    let j = pair_of_dim(d);
    let dims = pair_dims(j);
    let pair = rotate(vec2<f32>(k[row + dims.x], k[row + dims.y]), rotation(position, j));
    return select(pair.x, pair.y, d == dims.y);
}

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
    let position = positions[token];

    if head < params.q_heads {
        if j < ROT_PAIRS {
            let row = (token * params.q_heads + head) * HEAD_DIM;
            let d = pair_dims(j);
            let pair = rotate(vec2<f32>(q[row + d.x], q[row + d.y]), rotation(position, j));
            q[row + d.x] = pair.x;
            q[row + d.y] = pair.y;
        }
        return;
    }
    let slot = slots[token];
    if slot >= params.n_slots {
        return;
    }
    let kv_head = head - params.q_heads;
    let row = (token * params.kv_heads + kv_head) * HEAD_DIM;
    let key = vec2<f32>(rotated_key_dim(row, 2u * j, position), rotated_key_dim(row, 2u * j + 1u, position));
    let word = (slot * params.kv_heads + kv_head) * HALF + j;
    k_cache[word] = pack2x16float(key);
    v_cache[word] = pack2x16float(vec2<f32>(v[row + 2u * j], v[row + 2u * j + 1u]));
}
