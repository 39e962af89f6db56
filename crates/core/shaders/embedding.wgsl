// Embedding row gather: out[i, :] = W[ids[i], :], dequantized to f32.
//
// Composed after shaders/quant/common.wgsl and one decoder, which supply decode8().
// Layout: `weights` is one chunk of W (rows first_row .. first_row + rows, `row_words` words a
//   row, see common.wgsl); ids is [count] u32; out is [count, cols] f32 as vec4s; cols is a
//   multiple of 8.
// Workgroup: WG_SIZE invocations, each decoding one group of 8 weights of one id: invocation
//   n handles id n / (cols / 8), weights 8 (n % (cols / 8)) .. + 8. The grid may be 2-D
//   (linear index wg.x + wg.y * num_workgroups.x); invocations past count * cols / 8 do nothing.
// Bounds: an id outside this chunk reads nothing; the dispatch with `zero_missing` set writes
//   zeros for ids >= total_rows, so every output row is written and nothing is read out of
//   bounds whatever the ids hold.

struct Params {
    rows: u32,
    first_row: u32,
    cols: u32,
    count: u32,
    row_words: u32,
    blocks: u32,
    total_rows: u32,
    zero_missing: u32,
}

// @binding(0): `weights`, declared in quant/common.wgsl.
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
// In a storage buffer where the weights are a texture (see quant/common.wgsl).
#if TEXTURE_WEIGHTS
@group(0) @binding(3) var<storage, read> params: Params;
#else
@group(0) @binding(3) var<uniform> params: Params;
#endif

@compute @workgroup_size(WG_SIZE)
fn embedding(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let n = (wg.x + wg.y * groups.x) * WG_SIZE + lane;
    let groups_per_row = params.cols / 8u;
    let i = n / groups_per_row;
    if i >= params.count {
        return;
    }
    let g = n % groups_per_row;
    let id = ids[i];
    let at = i * (params.cols / 4u) + 2u * g;
    if id >= params.first_row && id - params.first_row < params.rows {
        let w = decode8(WeightRow((id - params.first_row) * params.row_words, params.blocks), g * 8u);
        out[at] = w.lo;
        out[at + 1u] = w.hi;
    } else if params.zero_missing != 0u && id >= params.total_rows {
        out[at] = vec4<f32>(0.0);
        out[at + 1u] = vec4<f32>(0.0);
    }
}
