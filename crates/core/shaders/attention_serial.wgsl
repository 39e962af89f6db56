// What the serial attention kernels share (attention_decode_serial.wgsl and
// attention_prefill_serial.wgsl, for CPU devices such as lavapipe). Follows attention.wgsl.
// WG lanes split each head's dims, lane holding its vec4s lane, lane + WG, ...
const LANE_VEC4S: u32 = (HEAD_VEC4S + WG - 1u) / WG;

// Index of this lane's vec4 `j` of a head, clamped to the head: lanes past its end load its last
// vec4 again, and their zero queries cancel it.
fn lane_vec4(lane: u32, j: u32) -> u32 {
    return min(lane + j * WG, HEAD_VEC4S - 1u);
}

// One key's step of a row's online softmax, when the row `sees` the key of `score` (else the
// row keeps its maximum and adds nothing): returns the row's new maximum and sum, the factor its
// accumulator is rescaled by, and the key's weight. No branch on whether the maximum moves: with
// lanes in step, the rescale is one multiply-add per accumulator anyway.
fn softmax_step(running_max: f32, sum: f32, score: f32, sees: bool) -> vec4<f32> {
    let new_max = select(running_max, max(running_max, score), sees);
    let rescale = exp(running_max - new_max);
    let p = select(0.0, exp(score - new_max), sees);
    return vec4<f32>(new_max, sum * rescale + p, rescale, p);
}
