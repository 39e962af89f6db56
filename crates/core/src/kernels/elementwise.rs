//! Element-wise kernels (`shaders/elementwise.wgsl`): gated activations of the feed-forward
//! block, residual add, bias add and scaling; and the row softmax (`shaders/softmax.wgsl`).
//!
//! Each comes out of place (`out` has as many elements as the inputs) or in place (the result
//! overwrites the first input).
//!
//! ```no_run
//! # async fn example(ctx: &flint_core::gpu::GpuContext) -> flint_core::Result<()> {
//! use flint_core::gpu::Tensor;
//! use flint_core::kernels::elementwise::{GatedActivation, add_in_place, gated_activation_in_place};
//!
//! let ff = 1536;
//! let gate = Tensor::from_slice(ctx, "gate", &[ff], &vec![0.5f32; ff])?;
//! let up = Tensor::from_slice(ctx, "up", &[ff], &vec![2.0f32; ff])?;
//! let residual = Tensor::from_slice(ctx, "residual", &[ff], &vec![1.0f32; ff])?;
//! let mut encoder = ctx.encoder("ffn");
//! gated_activation_in_place(ctx, &mut encoder, GatedActivation::Silu, &gate, &up)?;
//! add_in_place(ctx, &mut encoder, &residual, &gate)?;
//! ctx.submit(encoder)?;
//! # Ok(())
//! # }
//! ```

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, Tensor};
use crate::kernels::ensure;
use crate::kernels::norm::REDUCTION_WG_SIZE;
use crate::tuning::reduction_rows_per_workgroup;

const ELEMENTWISE_SOURCE: &str = include_str!("../../shaders/elementwise.wgsl");
/// The activation functions, shared with the matmul kernel's gated input.
pub(crate) const ACTIVATION_SOURCE: &str = include_str!("../../shaders/activation.wgsl");
const SOFTMAX_SOURCE: &str = include_str!("../../shaders/softmax.wgsl");
const ELEMENTWISE_WG_SIZE: u32 = 256;

/// The activation of a gated feed-forward block: `out = act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GatedActivation {
    /// `silu(x) = x · sigmoid(x)` (SwiGLU: Llama, Qwen, Mistral ...).
    Silu,
    /// GELU with the tanh approximation, `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (GeGLU:
    /// Gemma).
    GeluTanh,
}

impl GatedActivation {
    fn entry(self) -> &'static str {
        match self {
            GatedActivation::Silu => "silu_mul",
            GatedActivation::GeluTanh => "gelu_mul",
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    count: u32,
    factor: f32,
    /// `add_bias` only: the length of the bias row.
    bias_len: u32,
    _pad: u32,
}

/// Records `out = act(gate) * up`, element by element.
pub fn gated_activation(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    activation: GatedActivation,
    gate: &Tensor,
    up: &Tensor,
    out: &Tensor,
) -> Result<()> {
    record(ctx, encoder, activation.entry(), gate, Some(up), Some(out), 1.0)
}

/// Records `gate = act(gate) * up`, element by element.
pub fn gated_activation_in_place(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    activation: GatedActivation,
    gate: &Tensor,
    up: &Tensor,
) -> Result<()> {
    record(ctx, encoder, activation.entry(), gate, Some(up), None, 1.0)
}

/// Records `out = a + b`, element by element.
pub fn add(ctx: &GpuContext, encoder: &mut Encoder, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    record(ctx, encoder, "add", a, Some(b), Some(out), 1.0)
}

/// Records `a += b` (the residual connection), element by element.
pub fn add_in_place(ctx: &GpuContext, encoder: &mut Encoder, a: &Tensor, b: &Tensor) -> Result<()> {
    record(ctx, encoder, "add", a, Some(b), None, 1.0)
}

/// Records `x[r, c] += bias[c]`: the `[cols]` bias added to every row of `x`, whose last
/// dimension is `cols` (the biases of Qwen 2's q, k and v projections).
pub fn add_bias_in_place(ctx: &GpuContext, encoder: &mut Encoder, x: &Tensor, bias: &Tensor) -> Result<()> {
    const ENTRY: &str = "add_bias";
    let cols = bias.len();
    ensure(ENTRY, cols > 0 && x.shape().last() == Some(&cols), || {
        format!(
            "x has shape {:?} and the bias {cols} elements; x's last dimension must be the bias length",
            x.shape()
        )
    })?;
    ensure(ENTRY, x.buffer() != bias.buffer(), || "the bias must not be x".to_string())?;
    if x.is_empty() {
        return Ok(());
    }
    let count = x.len() as u32;
    let params = encoder.params(ctx, &Params { count, factor: 1.0, bias_len: cols as u32, _pad: 0 })?;
    ctx.dispatch(
        encoder,
        &elementwise_source(ENTRY, true, true),
        &[params.binding(), x.binding(), bias.binding()],
        ctx.grid(count.div_ceil(ELEMENTWISE_WG_SIZE)),
    )
}

/// Records `out = x * factor`, element by element.
pub fn scale(ctx: &GpuContext, encoder: &mut Encoder, x: &Tensor, factor: f32, out: &Tensor) -> Result<()> {
    record(ctx, encoder, "scale", x, None, Some(out), factor)
}

/// Records `x *= factor`, element by element.
pub fn scale_in_place(ctx: &GpuContext, encoder: &mut Encoder, x: &Tensor, factor: f32) -> Result<()> {
    record(ctx, encoder, "scale", x, None, None, factor)
}

fn elementwise_source(entry: &'static str, binary: bool, in_place: bool) -> KernelSource {
    KernelSource::new(entry, &[ACTIVATION_SOURCE, ELEMENTWISE_SOURCE])
        .define("WG_SIZE", format!("{ELEMENTWISE_WG_SIZE}u"))
        .define("BINARY", binary)
        .define("IN_PLACE", in_place)
        // `out` follows the inputs: binding 3 after `a` and `b`, binding 2 after `a` alone.
        .define("OUT_BINDING", if binary { "3u" } else { "2u" })
}

fn record(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    entry: &'static str,
    a: &Tensor,
    b: Option<&Tensor>,
    out: Option<&Tensor>,
    factor: f32,
) -> Result<()> {
    let count = a.len();
    for (role, tensor) in [("second input", b), ("out", out)] {
        if let Some(tensor) = tensor {
            ensure(entry, tensor.len() == count, || {
                format!(
                    "the first input has {count} elements but {role} has {}; they must be equal",
                    tensor.len()
                )
            })?;
        }
    }
    let written = out.unwrap_or(a);
    let read = [out.map(|_| a), b];
    ensure(entry, read.into_iter().flatten().all(|input| input.buffer() != written.buffer()), || {
        "the tensor written is also an input: out must be a tensor of its own; \
         the in-place form overwrites the first input"
            .to_string()
    })?;
    ensure(entry, factor.is_finite(), || format!("the factor is {factor}; it must be finite"))?;
    if count == 0 {
        return Ok(());
    }
    let params = encoder.params(ctx, &Params { count: count as u32, factor, bias_len: 0, _pad: 0 })?;
    let mut bindings = vec![params.binding(), a.binding()];
    bindings.extend(b.map(Tensor::binding));
    bindings.extend(out.map(Tensor::binding));
    let source = elementwise_source(entry, b.is_some(), out.is_none());
    ctx.dispatch(encoder, &source, &bindings, ctx.grid((count as u32).div_ceil(ELEMENTWISE_WG_SIZE)))
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SoftmaxParams {
    rows: u32,
    n: u32,
    scale: f32,
    _pad: u32,
}

/// Records `out = softmax(x * scale)` over `x`'s last dimension, each row shifted by its max
/// first so that large inputs do not overflow. `-inf` inputs (masked logits) get probability 0.
pub fn softmax(ctx: &GpuContext, encoder: &mut Encoder, x: &Tensor, scale: f32, out: &Tensor) -> Result<()> {
    ensure("softmax", out.len() == x.len(), || {
        format!("x has {} elements but out has {}; they must be equal", x.len(), out.len())
    })?;
    ensure("softmax", out.buffer() != x.buffer(), || {
        "out is x: to overwrite x use softmax_in_place".to_string()
    })?;
    record_softmax(ctx, encoder, x, scale, Some(out), reduction_rows_per_workgroup(ctx))
}

/// Records `x = softmax(x * scale)` over `x`'s last dimension (see [`softmax`]).
pub fn softmax_in_place(ctx: &GpuContext, encoder: &mut Encoder, x: &Tensor, scale: f32) -> Result<()> {
    record_softmax(ctx, encoder, x, scale, None, reduction_rows_per_workgroup(ctx))
}

fn softmax_source(ctx: &GpuContext, in_place: bool, rows_per_workgroup: u32) -> KernelSource {
    KernelSource::new("softmax", &[SOFTMAX_SOURCE])
        .define("WG_SIZE", format!("{REDUCTION_WG_SIZE}u"))
        .define("ROWS_PER_WG", format!("{rows_per_workgroup}u"))
        .define("IN_PLACE", in_place)
        .define("SUBGROUPS", ctx.features().subgroups)
}

fn record_softmax(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    x: &Tensor,
    scale: f32,
    out: Option<&Tensor>,
    rows_per_workgroup: u32,
) -> Result<()> {
    ensure("softmax", scale.is_finite(), || format!("the scale is {scale}; it must be finite"))?;
    let n = x.shape().last().copied().unwrap_or(0);
    ensure("softmax", n > 0 || x.is_empty(), || {
        format!("x has shape {:?}; softmax needs a last dimension to normalise over", x.shape())
    })?;
    if x.is_empty() {
        return Ok(());
    }
    let rows = x.len() / n;
    let params = encoder.params(ctx, &SoftmaxParams { rows: rows as u32, n: n as u32, scale, _pad: 0 })?;
    let mut bindings = vec![params.binding(), x.binding()];
    bindings.extend(out.map(Tensor::binding));
    let source = softmax_source(ctx, out.is_none(), rows_per_workgroup);
    ctx.dispatch(encoder, &source, &bindings, ctx.grid((rows as u32).div_ceil(rows_per_workgroup)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::norm::tests::team_shapes;
    use crate::kernels::testing::{POISON, Rng, assert_close, both_paths, gpu, gpu_portable, validate_wgsl};

    /// One rounded operation (add, scale) on exact f32 inputs.
    const ARITHMETIC_TOLERANCE: f32 = 1e-7;
    /// WGSL bounds exp(z) within 3 + 2|z| ULP (lavapipe uses much of that in the tails); three
    /// more roundings (the add, the division, the product with `up`).
    fn activation_tolerance(max_exp_argument: f32) -> f32 {
        (6.0 + 2.0 * max_exp_argument) * f32::EPSILON
    }
    /// exp within a few ULP, sums of up to n / 64 + 64 terms and a division (measured on
    /// lavapipe: at most 6e-7).
    const SOFTMAX_TOLERANCE: f32 = 2e-6;

    /// [`SOFTMAX_TOLERANCE`] plus the rounding of `x * scale` to f32, which moves exp's argument
    /// by up to half an ULP of the largest scaled input.
    fn softmax_tolerance(max_abs_scaled: f32) -> f32 {
        SOFTMAX_TOLERANCE + max_abs_scaled * f32::EPSILON
    }

    const SIZES: [usize; 8] = [1, 7, 63, 65, 576, 1000, 4099, 70_001];

    /// Poisons `out`, runs `launch` and reads `out` back.
    fn run(ctx: &GpuContext, out: &Tensor, launch: impl FnOnce(&mut Encoder)) -> Vec<f32> {
        out.fill_bits(ctx, POISON);
        let mut encoder = ctx.encoder("test");
        launch(&mut encoder);
        ctx.submit(encoder).unwrap();
        pollster::block_on(out.to_f32(ctx)).unwrap()
    }

    fn upload(ctx: &GpuContext, name: &str, data: &[f32]) -> Tensor {
        Tensor::from_slice(ctx, name, &[data.len()], data).unwrap()
    }

    fn silu_reference(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    fn gelu_tanh_reference(x: f64) -> f64 {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        0.5 * x * (1.0 + u.tanh())
    }

    #[test]
    fn every_variant_validates() {
        for entry in ["silu_mul", "gelu_mul", "add", "add_bias"] {
            for in_place in [false, true] {
                validate_wgsl(&elementwise_source(entry, true, in_place));
            }
        }
        for in_place in [false, true] {
            validate_wgsl(&elementwise_source("scale", false, in_place));
            for ctx in [gpu(), gpu_portable()] {
                for rows_per_workgroup in team_shapes(ctx) {
                    validate_wgsl(&softmax_source(ctx, in_place, rows_per_workgroup));
                }
            }
        }
        assert!(gpu().features().subgroups, "the test device should exercise the subgroup path too");
    }

    #[test]
    fn gated_activations_match_the_reference() {
        let ctx = gpu();
        let mut rng = Rng::new("gated activations");
        for activation in [GatedActivation::Silu, GatedActivation::GeluTanh] {
            // Where the activations bend; the tails have a test of their own. The largest
            // argument of exp is -x for SiLU and -2u for GELU.
            let (gate_range, max_exp_argument) = (6.0, 25.0);
            let (reference, tolerance): (fn(f64) -> f64, f32) = match activation {
                GatedActivation::Silu => (silu_reference, activation_tolerance(gate_range)),
                GatedActivation::GeluTanh => (gelu_tanh_reference, activation_tolerance(max_exp_argument)),
            };
            for n in SIZES {
                for in_place in [false, true] {
                    let gate = rng.f32s(n, -gate_range, gate_range);
                    let up = rng.f32s(n, -3.0, 3.0);
                    let (gate_gpu, up_gpu) = (upload(ctx, "gate", &gate), upload(ctx, "up", &up));
                    let got = if in_place {
                        let mut encoder = ctx.encoder("test");
                        gated_activation_in_place(ctx, &mut encoder, activation, &gate_gpu, &up_gpu).unwrap();
                        ctx.submit(encoder).unwrap();
                        pollster::block_on(gate_gpu.to_f32(ctx)).unwrap()
                    } else {
                        let out = Tensor::empty(ctx, "out", &[n]).unwrap();
                        run(ctx, &out, |encoder| {
                            gated_activation(ctx, encoder, activation, &gate_gpu, &up_gpu, &out).unwrap()
                        })
                    };
                    let expected: Vec<f32> = gate
                        .iter()
                        .zip(&up)
                        .map(|(&g, &u)| (reference(f64::from(g)) * f64::from(u)) as f32)
                        .collect();
                    let what = format!("{activation:?} n {n} in_place {in_place}");
                    assert_close(&what, &got, &expected, tolerance);
                }
            }
        }
    }

    #[test]
    fn activations_are_exact_in_their_tails_and_never_nan() {
        let ctx = gpu();
        let gate = [-1e30f32, -500.0, -88.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.0, 500.0, 1e30];
        let up = vec![1.0f32; gate.len()];
        let (gate_gpu, up_gpu) = (upload(ctx, "gate", &gate), upload(ctx, "up", &up));
        let out = Tensor::empty(ctx, "out", &[gate.len()]).unwrap();
        for (activation, reference) in [
            (GatedActivation::Silu, silu_reference as fn(f64) -> f64),
            (GatedActivation::GeluTanh, gelu_tanh_reference),
        ] {
            let got = run(ctx, &out, |encoder| {
                gated_activation(ctx, encoder, activation, &gate_gpu, &up_gpu, &out).unwrap()
            });
            for (&g, &y) in gate.iter().zip(&got) {
                let expected = reference(f64::from(g));
                let error = (f64::from(y) - expected).abs();
                assert!(
                    error <= 1e-6 * expected.abs() + 1e-36,
                    "{activation:?}({g}) = {y}, expected {expected}"
                );
            }
        }
    }

    #[test]
    fn add_and_scale_match_the_reference() {
        let ctx = gpu();
        let mut rng = Rng::new("add and scale");
        for n in SIZES {
            let a = rng.f32s(n, -10.0, 10.0);
            let b = rng.f32s(n, -10.0, 10.0);
            let factor = rng.f32(-4.0, 4.0);
            let (a_gpu, b_gpu) = (upload(ctx, "a", &a), upload(ctx, "b", &b));
            let out = Tensor::empty(ctx, "out", &[n]).unwrap();

            let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            let got = run(ctx, &out, |encoder| add(ctx, encoder, &a_gpu, &b_gpu, &out).unwrap());
            assert_close(&format!("add n {n}"), &got, &sum, ARITHMETIC_TOLERANCE);

            let scaled: Vec<f32> = a.iter().map(|x| x * factor).collect();
            let got = run(ctx, &out, |encoder| scale(ctx, encoder, &a_gpu, factor, &out).unwrap());
            assert_close(&format!("scale n {n}"), &got, &scaled, ARITHMETIC_TOLERANCE);

            // In place: a = (a + b) * factor.
            let mut encoder = ctx.encoder("test");
            add_in_place(ctx, &mut encoder, &a_gpu, &b_gpu).unwrap();
            scale_in_place(ctx, &mut encoder, &a_gpu, factor).unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(a_gpu.to_f32(ctx)).unwrap();
            let expected: Vec<f32> = sum.iter().map(|x| x * factor).collect();
            assert_close(&format!("add and scale in place n {n}"), &got, &expected, ARITHMETIC_TOLERANCE);
        }
    }

    #[test]
    fn bias_add_matches_the_reference() {
        let ctx = gpu();
        let mut rng = Rng::new("add bias");
        for (rows, cols) in [(1, 1), (1, 576), (3, 7), (17, 65), (5, 1000), (70, 4099)] {
            let x = rng.f32s(rows * cols, -10.0, 10.0);
            let bias = rng.f32s(cols, -10.0, 10.0);
            let x_gpu = Tensor::from_slice(ctx, "x", &[rows, cols], &x).unwrap();
            let bias_gpu = upload(ctx, "bias", &bias);
            let mut encoder = ctx.encoder("test");
            add_bias_in_place(ctx, &mut encoder, &x_gpu, &bias_gpu).unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(x_gpu.to_f32(ctx)).unwrap();
            let expected: Vec<f32> = x.iter().enumerate().map(|(i, v)| v + bias[i % cols]).collect();
            assert_close(&format!("add bias {rows}x{cols}"), &got, &expected, ARITHMETIC_TOLERANCE);
        }
        let x = Tensor::empty(ctx, "x", &[3, 8]).unwrap();
        let wrong = Tensor::empty(ctx, "bias", &[3]).unwrap();
        let err = add_bias_in_place(ctx, &mut ctx.encoder("test"), &x, &wrong).unwrap_err();
        assert!(err.to_string().contains("bias length"), "{err}");
    }

    #[test]
    fn more_elements_than_one_grid_dimension_holds() {
        let ctx = gpu();
        let mut rng = Rng::new("add many elements");
        // More than 65535 workgroups of 256.
        let n = 65_535 * 256 + 257;
        let a = rng.f32s(n, -10.0, 10.0);
        let b = rng.f32s(n, -10.0, 10.0);
        let (a_gpu, b_gpu) = (upload(ctx, "a", &a), upload(ctx, "b", &b));
        let mut encoder = ctx.encoder("test");
        add_in_place(ctx, &mut encoder, &a_gpu, &b_gpu).unwrap();
        ctx.submit(encoder).unwrap();
        let got = pollster::block_on(a_gpu.to_f32(ctx)).unwrap();
        let expected: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_close(&format!("add in place n {n}"), &got, &expected, ARITHMETIC_TOLERANCE);
    }

    fn softmax_reference(x: &[f32], n: usize, scale: f32) -> Vec<f32> {
        x.chunks(n)
            .flat_map(|row| {
                let scaled: Vec<f64> = row.iter().map(|&v| f64::from(v) * f64::from(scale)).collect();
                let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scaled.iter().map(|v| (v - max).exp()).sum();
                scaled.into_iter().map(move |v| ((v - max).exp() / sum) as f32)
            })
            .collect()
    }

    fn run_softmax(
        ctx: &GpuContext,
        x: &[f32],
        shape: &[usize],
        scale: f32,
        in_place: bool,
        rows_per_workgroup: u32,
    ) -> Vec<f32> {
        let x_gpu = Tensor::from_slice(ctx, "x", shape, x).unwrap();
        if in_place {
            let mut encoder = ctx.encoder("test");
            record_softmax(ctx, &mut encoder, &x_gpu, scale, None, rows_per_workgroup).unwrap();
            ctx.submit(encoder).unwrap();
            pollster::block_on(x_gpu.to_f32(ctx)).unwrap()
        } else {
            let out = Tensor::empty(ctx, "out", shape).unwrap();
            run(ctx, &out, |encoder| {
                record_softmax(ctx, encoder, &x_gpu, scale, Some(&out), rows_per_workgroup).unwrap()
            })
        }
    }

    /// Runs a softmax of `x` with every team shape of every path and compares with the reference.
    fn check_softmax(what: &str, x: &[f32], shape: &[usize], scale: f32, in_place: bool, tolerance: f32) {
        let n = shape[shape.len() - 1];
        let expected = softmax_reference(x, n, scale);
        for (path, ctx) in both_paths() {
            for rows_per_workgroup in team_shapes(ctx) {
                let got = run_softmax(ctx, x, shape, scale, in_place, rows_per_workgroup);
                assert_close(
                    &format!("{what} ({path}, {rows_per_workgroup} rows per workgroup)"),
                    &got,
                    &expected,
                    tolerance,
                );
            }
        }
    }

    #[test]
    fn softmax_rows_of_awkward_lengths_match_the_reference() {
        let mut rng = Rng::new("softmax sizes");
        for n in [1usize, 7, 63, 65, 576, 1000, 4099] {
            for rows in [1usize, 3, 17] {
                let in_place = rows == 3;
                // Scaled to ±1000: exp of the raw values would overflow without the max shift.
                let x = rng.f32s(rows * n, -50.0, 50.0);
                let scale = if rows == 17 { 20.0 } else { 0.125 };
                let what = format!("softmax rows {rows} n {n} scale {scale} in_place {in_place}");
                check_softmax(&what, &x, &[rows, n], scale, in_place, softmax_tolerance(50.0 * scale));
            }
        }
    }

    #[test]
    fn softmax_gives_masked_logits_zero_probability() {
        let mut rng = Rng::new("softmax masked");
        let (rows, n) = (5, 300);
        let mut x = rng.f32s(rows * n, -4.0, 4.0);
        for row in 0..rows {
            // Mask a prefix of each row, and in row 1 everything but its last element.
            let masked = if row == 1 { n - 1 } else { rng.usize(0, n) };
            x[row * n..row * n + masked].fill(f32::NEG_INFINITY);
        }
        check_softmax("softmax masked", &x, &[rows, n], 1.0, false, softmax_tolerance(4.0));
    }

    #[test]
    fn softmax_of_more_rows_than_one_grid_dimension_holds() {
        let mut rng = Rng::new("softmax many rows");
        let ctx = gpu();
        let (rows, n) = (70_001, 3);
        let x = rng.f32s(rows * n, -5.0, 5.0);
        // One row per workgroup: more than 65535 workgroups.
        let got = run_softmax(ctx, &x, &[rows, n], 1.0, true, 1);
        assert_close("softmax 70001 rows", &got, &softmax_reference(&x, n, 1.0), softmax_tolerance(5.0));
    }

    #[test]
    fn mismatched_arguments_are_errors() {
        let ctx = gpu();
        let a = Tensor::empty(ctx, "a", &[12]).unwrap();
        let b = Tensor::empty(ctx, "b", &[13]).unwrap();
        let c = Tensor::empty(ctx, "c", &[12]).unwrap();
        let mut encoder = ctx.encoder("test");
        let err = add(ctx, &mut encoder, &a, &b, &a).unwrap_err();
        assert!(
            err.to_string().contains("'add'") && err.to_string().contains("second input has 13"),
            "{err}"
        );
        let err = gated_activation(ctx, &mut encoder, GatedActivation::Silu, &a, &a, &b).unwrap_err();
        assert!(err.to_string().contains("'silu_mul'") && err.to_string().contains("out has 13"), "{err}");
        let err = scale_in_place(ctx, &mut encoder, &a, f32::NAN).unwrap_err();
        assert!(err.to_string().contains("finite"), "{err}");
        let err = softmax(ctx, &mut encoder, &a, 1.0, &b).unwrap_err();
        assert!(err.to_string().contains("out has 13"), "{err}");
        let err = add(ctx, &mut encoder, &a, &c, &a).unwrap_err();
        assert!(err.to_string().contains("also an input"), "{err}");
        let err =
            gated_activation_in_place(ctx, &mut encoder, GatedActivation::GeluTanh, &a, &a).unwrap_err();
        assert!(err.to_string().contains("also an input"), "{err}");
        let err = softmax(ctx, &mut encoder, &a, 1.0, &a).unwrap_err();
        assert!(err.to_string().contains("softmax_in_place"), "{err}");
        let err = softmax_in_place(ctx, &mut encoder, &a, f32::INFINITY).unwrap_err();
        assert!(err.to_string().contains("scale"), "{err}");
    }
}
