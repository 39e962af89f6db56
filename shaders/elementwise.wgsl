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

// x·sigmoid(z) = x / (1 + exp(-z)). The clamp keeps exp's result finite (WGSL lets
// implementations assume there are no infinities) and changes nothing that shows: above
// z = 88, exp(-z) and exp(-88) both vanish next to 1; below z = -88 the sigmoid is under 6e-39
// and the result is taken as 0.
fn times_sigmoid(x: f32, z: f32) -> f32 {
    let e = exp(clamp(-z, -88.0, 88.0));
    return select(x / (1.0 + e), 0.0, z < -88.0);
}

fn silu(x: f32) -> f32 {
    return times_sigmoid(x, x);
}

// GELU, tanh approximation: 0.5·x·(1 + tanh(u)) with u = sqrt(2/π)·(x + 0.044715·x³), computed
// as x·sigmoid(2u), the same function without tanh's inf/inf for large |u|.
fn gelu_tanh(x: f32) -> f32 {
    let u = 0.7978845608028654 * x * (1.0 + 0.044715 * x * x);
    return times_sigmoid(x, 2.0 * u);
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
