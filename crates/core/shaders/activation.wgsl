// The activations of gated feed-forward layers, shared by elementwise.wgsl and matmul.wgsl.

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

// The activation a GATE_SILU or GATE_GELU variant applies to the gate.
fn activate(gate: f32) -> f32 {
#if GATE_GELU
    return gelu_tanh(gate);
#else
    return silu(gate);
#endif
}

fn activate4(gate: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(activate(gate.x), activate(gate.y), activate(gate.z), activate(gate.w));
}
