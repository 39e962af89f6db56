// Device memory bandwidth probes: the roofline that kernel speed is measured against.
//
// Layout: `src` and `dst` are arrays of vec4<u32>; `params.count` vec4s are moved.
// Workgroup: WG_SIZE invocations, one vec4 each per grid-stride step; the grid may be 2-D
// (workgroup index = wg.x + wg.y * num_workgroups.x) when it exceeds 65535 workgroups.

struct Params {
    count: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG_SIZE)
fn copy_vec4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = (wg.x + wg.y * groups.x) * WG_SIZE + lane;
    if i < params.count {
        dst[i] = src[i];
    }
}

// Reads every vec4 and writes one word per invocation, so the bytes moved are (almost) all reads.
@compute @workgroup_size(WG_SIZE)
fn read_vec4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let first = (wg.x + wg.y * groups.x) * WG_SIZE + lane;
    let stride = groups.x * groups.y * WG_SIZE;
    var acc = vec4<u32>(0u);
    for (var i = first; i < params.count; i += stride) {
        acc ^= src[i];
    }
    // The xor keeps the loads alive; the write is one word per invocation.
    if first < arrayLength(&dst) * 4u {
        dst[first / 4u][first % 4u] = acc.x ^ acc.y ^ acc.z ^ acc.w;
    }
}
