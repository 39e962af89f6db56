// Element-wise kernels: gated activations (SiLU, GELU with the tanh approximation), residual
// add, bias add and scaling.
//
// Layout: `a`, `b` and `out` hold `params.count` f32 each (BINARY kernels read `a` and `b`,
// `scale` reads `a` only), except `add_bias`, whose `b` is one row of `params.bias_len`
// elements added to every row of `a` (count a multiple of bias_len). With IN_PLACE the result
// overwrites `a` and there is no `out` binding; OUT_BINDING is `out`'s binding number otherwise.
// Workgroup: WG_SIZE invocations, one element each; the grid may be 2-D
// (index = wg.x + wg.y * num_workgroups.x) and indices past params.count do nothing.
// Bounds: any count >= 1.
// Composed after activation.wgsl.

struct Params {
    count: u32,
    factor: f32,
    bias_len: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
#if IN_PLACE
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
#else
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(OUT_BINDING) var<storage, read_write> out: array<f32>;
#endif
#if BINARY
@group(0) @binding(2) var<storage, read> b: array<f32>;
#endif

fn store(i: u32, value: f32) {
#if IN_PLACE
    a[i] = value;
#else
    out[i] = value;
#endif
}

fn element_index(wg: vec3<u32>, groups: vec3<u32>, lane: u32) -> u32 {
    return (wg.x + wg.y * groups.x) * WG_SIZE + lane;
}

#if BINARY
// out = silu(gate) * up, gate in `a`, up in `b`.
@compute @workgroup_size(WG_SIZE)
fn silu_mul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = element_index(wg, groups, lane);
    if i < params.count {
        store(i, silu(a[i]) * b[i]);
    }
}

// out = gelu_tanh(gate) * up, gate in `a`, up in `b`.
@compute @workgroup_size(WG_SIZE)
fn gelu_mul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = element_index(wg, groups, lane);
    if i < params.count {
        store(i, gelu_tanh(a[i]) * b[i]);
    }
}

// out = a + b.
@compute @workgroup_size(WG_SIZE)
fn add(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = element_index(wg, groups, lane);
    if i < params.count {
        store(i, a[i] + b[i]);
    }
}

// out = a + b broadcast over rows: b[i % bias_len].
@compute @workgroup_size(WG_SIZE)
fn add_bias(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = element_index(wg, groups, lane);
    if i < params.count {
        store(i, a[i] + b[i % params.bias_len]);
    }
}
#else
// out = a * params.factor.
@compute @workgroup_size(WG_SIZE)
fn scale(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    let i = element_index(wg, groups, lane);
    if i < params.count {
        store(i, a[i] * params.factor);
    }
}
#endif
