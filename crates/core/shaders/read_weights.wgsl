// Bandwidth probe for weights: reads a weight chunk 16 bytes at a time through words4(), as the
// kernels that read weights do (from a texture on CPU devices, else a storage buffer), so that
// the roofline includes the fastest path that weights actually take.
//
// Composed after shaders/quant/common.wgsl and a decoder, which declare `weights` and words4().
// Layout: params.count vec4s of the bound chunk are read; each invocation xors what it reads and
// writes one word of `sink`. Workgroup: WG_SIZE invocations, grid-stride over the vec4s; the
// grid may be 2-D (workgroup index = wg.x + wg.y * num_workgroups.x).

struct Params {
    count: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(1) var<storage, read_write> sink: array<u32>;
// In a storage buffer where the weights are a texture (see quant/common.wgsl).
#if TEXTURE_WEIGHTS
@group(0) @binding(2) var<storage, read> params: Params;
#else
@group(0) @binding(2) var<uniform> params: Params;
#endif

@compute @workgroup_size(WG_SIZE)
fn read_weights(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let count = params.count;
    let first = (wg.x + wg.y * groups.x) * WG_SIZE + lane;
    let stride = groups.x * groups.y * WG_SIZE;
    var acc = vec4<u32>(0u);
    for (var i = first; i < count; i += stride) {
        acc ^= words4(4u * i);
    }
    // The xor keeps the loads alive; the write is one word per invocation.
    if first < arrayLength(&sink) {
        sink[first] = acc.x ^ acc.y ^ acc.z ^ acc.w;
    }
}
