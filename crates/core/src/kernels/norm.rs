//! RMSNorm over the last dimension (`shaders/norm.wgsl`), out of place or in place, and the
//! joint of post-norm sublayers that adds a normalised output to the residual stream and
//! normalises the sum for the next sublayer in the same pass ([`rms_norm_residual`]).
//!
//! `dim` is the weight's length and every consecutive run of `dim` elements of `x` is one row, so
//! the same launcher normalises the hidden state (`[tokens, hidden]`, weight `[hidden]`) and
//! each attention head on its own (`[tokens, heads * head_dim]`, weight `[head_dim]`).
//!
//! ```no_run
//! # async fn example(ctx: &flint_core::gpu::GpuContext) -> flint_core::Result<()> {
//! use flint_core::gpu::Tensor;
//! use flint_core::kernels::norm::{NormWeight, RmsNorm, rms_norm};
//!
//! let (tokens, hidden) = (3, 576);
//! let weight = Tensor::from_slice(ctx, "attn_norm.weight", &[hidden], &vec![1.0f32; hidden])?;
//! let x = Tensor::from_slice(ctx, "hidden", &[tokens, hidden], &vec![0.5f32; tokens * hidden])?;
//! let normed = Tensor::empty(ctx, "normed", &[tokens, hidden])?;
//! let norm = RmsNorm { weight: &weight, convention: NormWeight::Scale, eps: 1e-5 };
//! let mut encoder = ctx.encoder("layer 0");
//! rms_norm(ctx, &mut encoder, &norm, &x, &normed)?;
//! ctx.submit(encoder)?;
//! assert_eq!(normed.to_f32(ctx).await?.len(), tokens * hidden);
//! # Ok(())
//! # }
//! ```

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, Tensor};
use crate::kernels::ensure;
use crate::tuning::reduction_rows_per_workgroup;

const SOURCE: &str = include_str!("../../shaders/norm.wgsl");
/// Invocations per workgroup of the row reductions (RMSNorm here, softmax in `elementwise`).
pub(crate) const REDUCTION_WG_SIZE: u32 = 64;

/// How RMSNorm applies its learned weight `w` to the normalised row `x̂ = x / rms(x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormWeight {
    /// `y = x̂ · w`: llama.cpp's convention, and that of GGUF files of every architecture
    /// (llama.cpp's converter stores Gemma's weights as `1 + w` already).
    Scale,
    /// `y = x̂ · (1 + w)`: the convention of Gemma's Hugging Face checkpoints.
    OnePlus,
}

/// One RMSNorm layer: `y = x / sqrt(mean(x²) + eps)`, then scaled by the weight.
#[derive(Clone, Copy)]
pub struct RmsNorm<'a> {
    /// The learned weight, f32 `[dim]`; its length is the row length `dim`.
    pub weight: &'a Tensor,
    /// How the weight scales the normalised row.
    pub convention: NormWeight,
    /// Added to the mean square before the square root (the GGUF key
    /// `{arch}.attention.layer_norm_rms_epsilon`).
    pub eps: f32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    /// The second norm's eps of [`rms_norm_residual`].
    next_eps: f32,
}

/// Which kernel of `shaders/norm.wgsl` a dispatch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// One norm, into `out` or in place.
    Norm { in_place: bool },
    /// [`rms_norm_residual`], with or without the next sublayer's norm.
    Residual { next: bool },
}

/// Records `out = rms_norm(x)` row by row; `out` has as many elements as `x`.
pub fn rms_norm(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    norm: &RmsNorm<'_>,
    x: &Tensor,
    out: &Tensor,
) -> Result<()> {
    ensure("rms_norm", out.len() == x.len(), || {
        format!("x has {} elements but out has {}; they must be equal", x.len(), out.len())
    })?;
    record(ctx, encoder, norm, x, Some(out), reduction_rows_per_workgroup(ctx))
}

/// Records `x = rms_norm(x)` row by row.
pub fn rms_norm_in_place(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    norm: &RmsNorm<'_>,
    x: &Tensor,
) -> Result<()> {
    record(ctx, encoder, norm, x, None, reduction_rows_per_workgroup(ctx))
}

/// Records the joint between two sublayers of a model that normalises each sublayer's output
/// before adding it to the residual stream (Gemma 3's post-attention and post-FFN norms): row
/// by row, `x += post(sublayer)`, then with `next = (norm, out)`, `out = norm(x)`, the next
/// sublayer's normalised input. One dispatch for what [`rms_norm_in_place`], an add and
/// [`rms_norm`] record in three, with the same results; `sublayer` is left as it is.
///
/// `sublayer`, `x` and `out` have the same number of elements; both norms have weights of the
/// same length and the same [`NormWeight`] convention.
pub fn rms_norm_residual(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    post: &RmsNorm<'_>,
    sublayer: &Tensor,
    x: &Tensor,
    next: Option<(&RmsNorm<'_>, &Tensor)>,
) -> Result<()> {
    record_residual(ctx, encoder, post, sublayer, x, next, reduction_rows_per_workgroup(ctx))
}

fn source(ctx: &GpuContext, convention: NormWeight, form: Form, rows_per_workgroup: u32) -> KernelSource {
    let entry = match form {
        Form::Norm { .. } => "rms_norm",
        Form::Residual { .. } => "rms_norm_residual",
    };
    KernelSource::new(entry, &[SOURCE])
        .define("WG_SIZE", format!("{REDUCTION_WG_SIZE}u"))
        .define("ROWS_PER_WG", format!("{rows_per_workgroup}u"))
        .define("IN_PLACE", form == Form::Norm { in_place: true })
        .define("RESIDUAL", matches!(form, Form::Residual { .. }))
        .define("NEXT", form == Form::Residual { next: true })
        .define("ONE_PLUS_WEIGHT", convention == NormWeight::OnePlus)
        .define("SUBGROUPS", ctx.features().subgroups)
}

/// Checks `norm` against `x`, whose last dimension holds whole rows of the weight's length;
/// returns the number of rows.
fn rows_of(kernel: &'static str, norm: &RmsNorm<'_>, x: &Tensor) -> Result<usize> {
    let dim = norm.weight.len();
    let row_len = x.shape().last().copied();
    ensure(kernel, dim > 0 && row_len.is_some_and(|n| n.is_multiple_of(dim)), || {
        format!(
            "the weight has {dim} elements and x has shape {:?}; x's last dimension must be a \
             multiple of the weight's length (one row per weight-sized run)",
            x.shape()
        )
    })?;
    ensure(kernel, norm.eps.is_finite() && norm.eps >= 0.0, || {
        format!("eps is {}; it must be finite and not negative", norm.eps)
    })?;
    Ok(x.len() / dim)
}

/// Checks that no tensor written is also read, nor written twice.
fn distinct(kernel: &'static str, written: &[&Tensor], read: &[&Tensor]) -> Result<()> {
    let clash = written
        .iter()
        .enumerate()
        .any(|(i, w)| written[i + 1..].iter().chain(read).any(|other| other.buffer() == w.buffer()));
    ensure(kernel, !clash, || {
        "the tensor written is also read: out must be a tensor of its own, and the weight must \
         not be x"
            .to_string()
    })
}

fn record(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    norm: &RmsNorm<'_>,
    x: &Tensor,
    out: Option<&Tensor>,
    rows_per_workgroup: u32,
) -> Result<()> {
    let rows = rows_of("rms_norm", norm, x)?;
    match out {
        Some(out) => distinct("rms_norm", &[out], &[norm.weight, x])?,
        None => distinct("rms_norm", &[x], &[norm.weight])?,
    }
    if rows == 0 {
        return Ok(());
    }
    let dim = norm.weight.len() as u32;
    let params = encoder.params(ctx, &Params { rows: rows as u32, dim, eps: norm.eps, next_eps: 0.0 })?;
    let mut bindings = vec![params.binding(), norm.weight.binding(), x.binding()];
    bindings.extend(out.map(Tensor::binding));
    let source = source(ctx, norm.convention, Form::Norm { in_place: out.is_none() }, rows_per_workgroup);
    ctx.dispatch(encoder, &source, &bindings, ctx.grid((rows as u32).div_ceil(rows_per_workgroup)))
}

fn record_residual(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    post: &RmsNorm<'_>,
    sublayer: &Tensor,
    x: &Tensor,
    next: Option<(&RmsNorm<'_>, &Tensor)>,
    rows_per_workgroup: u32,
) -> Result<()> {
    const KERNEL: &str = "rms_norm_residual";
    let rows = rows_of(KERNEL, post, x)?;
    let lengths = [Some(sublayer), next.map(|(_, out)| out)];
    ensure(KERNEL, lengths.into_iter().flatten().all(|t| t.len() == x.len()), || {
        format!(
            "x has {} elements, the sublayer's output {} and out {:?}; they must be equal",
            x.len(),
            sublayer.len(),
            next.map(|(_, out)| out.len())
        )
    })?;
    let mut next_eps = 0.0;
    if let Some((norm, out)) = next {
        rows_of(KERNEL, norm, out)?;
        ensure(KERNEL, norm.weight.len() == post.weight.len() && norm.convention == post.convention, || {
            format!(
                "the norms have weights of {} and {} elements, conventions {:?} and {:?}: they \
                 must agree",
                post.weight.len(),
                norm.weight.len(),
                post.convention,
                norm.convention
            )
        })?;
        distinct(KERNEL, &[x, out], &[post.weight, sublayer, norm.weight])?;
        next_eps = norm.eps;
    } else {
        distinct(KERNEL, &[x], &[post.weight, sublayer])?;
    }
    if rows == 0 {
        return Ok(());
    }
    let dim = post.weight.len() as u32;
    let params = encoder.params(ctx, &Params { rows: rows as u32, dim, eps: post.eps, next_eps })?;
    let mut bindings = vec![params.binding(), post.weight.binding(), sublayer.binding(), x.binding()];
    if let Some((norm, out)) = next {
        bindings.extend([norm.weight.binding(), out.binding()]);
    }
    let source = source(ctx, post.convention, Form::Residual { next: next.is_some() }, rows_per_workgroup);
    ctx.dispatch(encoder, &source, &bindings, ctx.grid((rows as u32).div_ceil(rows_per_workgroup)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::testing::{POISON, Rng, assert_close, both_paths, gpu, gpu_portable, validate_wgsl};

    /// f32 sums of up to `dim / 8 + 64` squares, an `inverseSqrt` within 2 ULP and two rounded
    /// products: a few ULP (measured on lavapipe: at most 4e-7).
    const NORM_TOLERANCE: f32 = 2e-6;

    pub(crate) fn reference(x: &[f32], weight: &[f32], convention: NormWeight, eps: f32) -> Vec<f32> {
        let dim = weight.len();
        x.chunks(dim)
            .flat_map(|row| {
                let mean_square = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / dim as f64;
                let inv_rms = 1.0 / (mean_square + f64::from(eps)).sqrt();
                row.iter().zip(weight).map(move |(&v, &w)| {
                    let scale = match convention {
                        NormWeight::Scale => f64::from(w),
                        NormWeight::OnePlus => 1.0 + f64::from(w),
                    };
                    (f64::from(v) * inv_rms * scale) as f32
                })
            })
            .collect()
    }

    /// Rows per workgroup to test on a path: what the launcher picks on GPUs (1) and CPUs (8),
    /// and with subgroups 12, which takes lavapipe's 8 subgroups two steps, the second partial.
    pub(crate) fn team_shapes(ctx: &GpuContext) -> Vec<u32> {
        if ctx.features().subgroups { vec![1, 8, 12] } else { vec![1, 8] }
    }

    struct Case<'a> {
        x: &'a [f32],
        shape: &'a [usize],
        weight: &'a [f32],
        convention: NormWeight,
        eps: f32,
        in_place: bool,
    }

    /// Runs one norm on the GPU, in place or not, with the output poisoned first.
    fn run(ctx: &GpuContext, case: &Case<'_>, rows_per_workgroup: u32) -> Vec<f32> {
        let x = Tensor::from_slice(ctx, "x", case.shape, case.x).unwrap();
        let weight = Tensor::from_slice(ctx, "weight", &[case.weight.len()], case.weight).unwrap();
        let norm = RmsNorm { weight: &weight, convention: case.convention, eps: case.eps };
        let mut encoder = ctx.encoder("test");
        let result = if case.in_place {
            record(ctx, &mut encoder, &norm, &x, None, rows_per_workgroup).unwrap();
            x
        } else {
            let out = Tensor::empty(ctx, "out", case.shape).unwrap();
            out.fill_bits(ctx, POISON);
            record(ctx, &mut encoder, &norm, &x, Some(&out), rows_per_workgroup).unwrap();
            out
        };
        ctx.submit(encoder).unwrap();
        pollster::block_on(result.to_f32(ctx)).unwrap()
    }

    /// Runs `case` with every team shape of every path and compares with the reference.
    fn check(what: &str, case: &Case<'_>) {
        let expected = reference(case.x, case.weight, case.convention, case.eps);
        for (path, ctx) in both_paths() {
            for rows_per_workgroup in team_shapes(ctx) {
                let got = run(ctx, case, rows_per_workgroup);
                assert_close(
                    &format!("{what} ({path}, {rows_per_workgroup} rows per workgroup)"),
                    &got,
                    &expected,
                    NORM_TOLERANCE,
                );
            }
        }
    }

    #[test]
    fn every_variant_validates() {
        for ctx in [gpu(), gpu_portable()] {
            for convention in [NormWeight::Scale, NormWeight::OnePlus] {
                let forms = [false, true]
                    .into_iter()
                    .flat_map(|flag| [Form::Norm { in_place: flag }, Form::Residual { next: flag }]);
                for form in forms {
                    for rows_per_workgroup in team_shapes(ctx) {
                        validate_wgsl(&source(ctx, convention, form, rows_per_workgroup));
                    }
                }
            }
        }
        assert!(gpu().features().subgroups, "the test device should exercise the subgroup path too");
    }

    #[test]
    fn rows_of_awkward_lengths_match_the_reference() {
        let mut rng = Rng::new("rms_norm sizes");
        for dim in [1usize, 7, 63, 65, 576, 1000, 4099, 8192] {
            for rows in [1usize, 3, 17] {
                let x = rng.f32s(rows * dim, -3.0, 3.0);
                let weight = rng.f32s(dim, -2.0, 2.0);
                let case = Case {
                    x: &x,
                    shape: &[rows, dim],
                    weight: &weight,
                    convention: NormWeight::Scale,
                    eps: 1e-6,
                    in_place: false,
                };
                check(&format!("rms_norm rows {rows} dim {dim}"), &case);
            }
        }
    }

    #[test]
    fn gemma_weights_and_in_place_match_the_reference() {
        let mut rng = Rng::new("rms_norm variants");
        for convention in [NormWeight::Scale, NormWeight::OnePlus] {
            for in_place in [false, true] {
                // Per-head norm: rows of head_dim inside [tokens, heads * head_dim].
                let (tokens, heads, head_dim) = (5, 3, 256);
                let x = rng.f32s(tokens * heads * head_dim, -10.0, 10.0);
                let weight = rng.f32s(head_dim, -1.0, 1.0);
                let shape = [tokens, heads * head_dim];
                let case = Case { x: &x, shape: &shape, weight: &weight, convention, eps: 1e-5, in_place };
                check(&format!("rms_norm {convention:?} in_place {in_place}"), &case);
            }
        }
    }

    #[test]
    fn eps_dominates_a_zero_row() {
        let dim = 70;
        let mut x = vec![0.0f32; 2 * dim];
        x[dim..].fill(1e-3);
        let weight = vec![1.5f32; dim];
        let case = Case {
            x: &x,
            shape: &[2, dim],
            weight: &weight,
            convention: NormWeight::Scale,
            eps: 1e-2,
            in_place: false,
        };
        check("rms_norm eps", &case);
    }

    struct ResidualCase<'a> {
        sublayer: &'a [f32],
        x: &'a [f32],
        shape: &'a [usize],
        post: &'a [f32],
        /// The next norm's weight and eps.
        next: Option<(&'a [f32], f32)>,
        convention: NormWeight,
        eps: f32,
    }

    /// The new x and, with a next norm, its normalised copy, the outputs poisoned first.
    fn run_residual(
        ctx: &GpuContext,
        case: &ResidualCase<'_>,
        rows_per_workgroup: u32,
    ) -> (Vec<f32>, Vec<f32>) {
        let tensor =
            |name, shape: &[usize], data: &[f32]| Tensor::from_slice(ctx, name, shape, data).unwrap();
        let sublayer = tensor("sublayer", case.shape, case.sublayer);
        let x = tensor("x", case.shape, case.x);
        let post = tensor("post", &[case.post.len()], case.post);
        let post = RmsNorm { weight: &post, convention: case.convention, eps: case.eps };
        let out = Tensor::empty(ctx, "out", case.shape).unwrap();
        out.fill_bits(ctx, POISON);
        let next_weight = case.next.map(|(weight, _)| tensor("next", &[weight.len()], weight));
        let next = case
            .next
            .zip(next_weight.as_ref())
            .map(|((_, eps), weight)| (RmsNorm { weight, convention: case.convention, eps }, &out));
        let mut encoder = ctx.encoder("test");
        let next_arg = next.as_ref().map(|(norm, out)| (norm, *out));
        record_residual(ctx, &mut encoder, &post, &sublayer, &x, next_arg, rows_per_workgroup).unwrap();
        ctx.submit(encoder).unwrap();
        let read = |t: &Tensor| pollster::block_on(t.to_f32(ctx)).unwrap();
        (read(&x), if next.is_some() { read(&out) } else { Vec::new() })
    }

    fn check_residual(what: &str, case: &ResidualCase<'_>) {
        let normed = reference(case.sublayer, case.post, case.convention, case.eps);
        let new_x: Vec<f32> = case.x.iter().zip(&normed).map(|(&x, &p)| x + p).collect();
        let next_out =
            case.next.map_or_else(Vec::new, |(weight, eps)| reference(&new_x, weight, case.convention, eps));
        for (path, ctx) in both_paths() {
            for rows_per_workgroup in team_shapes(ctx) {
                let what = format!("{what} ({path}, {rows_per_workgroup} rows per workgroup)");
                let (x, out) = run_residual(ctx, case, rows_per_workgroup);
                assert_close(&format!("{what}: x"), &x, &new_x, NORM_TOLERANCE);
                assert_close(&format!("{what}: out"), &out, &next_out, NORM_TOLERANCE);
            }
        }
    }

    #[test]
    fn residual_joint_matches_the_reference() {
        let mut rng = Rng::new("rms_norm_residual");
        for (dim, rows) in [(1usize, 3usize), (63, 17), (65, 1), (640, 5), (1000, 9), (4099, 2)] {
            for (convention, next) in
                [(NormWeight::Scale, true), (NormWeight::OnePlus, true), (NormWeight::Scale, false)]
            {
                // Gemma's sublayer outputs and residual stream reach hundreds.
                let sublayer = rng.f32s(rows * dim, -300.0, 300.0);
                let x = rng.f32s(rows * dim, -50.0, 50.0);
                let post = rng.f32s(dim, -2.0, 20.0);
                let next_weight = rng.f32s(dim, -2.0, 2.0);
                let case = ResidualCase {
                    sublayer: &sublayer,
                    x: &x,
                    shape: &[rows, dim],
                    post: &post,
                    next: next.then_some((&next_weight[..], 1e-5)),
                    convention,
                    eps: 1e-6,
                };
                check_residual(
                    &format!("rms_norm_residual rows {rows} dim {dim} {convention:?} next {next}"),
                    &case,
                );
            }
        }
    }

    /// The joint gives what the three passes it replaces give, to within a few units in the last
    /// place: bit for bit on lavapipe, but a GPU's compiler may fuse a multiply and an add into one
    /// rounding in one kernel and not the other (seen on an NVIDIA H200 through Vulkan).
    #[test]
    fn residual_joint_equals_norm_add_norm() {
        use crate::kernels::elementwise::add_in_place;
        let mut rng = Rng::new("rms_norm_residual three passes");
        let (rows, dim) = (7, 640);
        let sublayer = rng.f32s(rows * dim, -300.0, 300.0);
        let x = rng.f32s(rows * dim, -50.0, 50.0);
        let post = rng.f32s(dim, 0.0, 20.0);
        let next_weight = rng.f32s(dim, 0.0, 3.0);
        for (path, ctx) in both_paths() {
            let tensor =
                |name, shape: &[usize], data: &[f32]| Tensor::from_slice(ctx, name, shape, data).unwrap();
            let (post_gpu, next_gpu) = (tensor("post", &[dim], &post), tensor("next", &[dim], &next_weight));
            let post_norm = RmsNorm { weight: &post_gpu, convention: NormWeight::Scale, eps: 1e-6 };
            let next_norm = RmsNorm { weight: &next_gpu, ..post_norm };
            let (sublayer_gpu, x_gpu) =
                (tensor("sublayer", &[rows, dim], &sublayer), tensor("x", &[rows, dim], &x));
            let out = Tensor::empty(ctx, "out", &[rows, dim]).unwrap();
            let mut encoder = ctx.encoder("test");
            rms_norm_in_place(ctx, &mut encoder, &post_norm, &sublayer_gpu).unwrap();
            add_in_place(ctx, &mut encoder, &x_gpu, &sublayer_gpu).unwrap();
            rms_norm(ctx, &mut encoder, &next_norm, &x_gpu, &out).unwrap();
            ctx.submit(encoder).unwrap();
            let read = |t: &Tensor| pollster::block_on(t.to_f32(ctx)).unwrap();
            let case = ResidualCase {
                sublayer: &sublayer,
                x: &x,
                shape: &[rows, dim],
                post: &post,
                next: Some((&next_weight, 1e-6)),
                convention: NormWeight::Scale,
                eps: 1e-6,
            };
            let fused = run_residual(ctx, &case, reduction_rows_per_workgroup(ctx));
            let ulps = 8.0 * f32::EPSILON;
            assert_close(&format!("{path}: x"), &fused.0, &read(&x_gpu), ulps);
            assert_close(&format!("{path}: out"), &fused.1, &read(&out), ulps);
        }
    }

    #[test]
    fn more_rows_than_one_grid_dimension_holds() {
        let mut rng = Rng::new("rms_norm many rows");
        let ctx = gpu();
        let (rows, dim) = (70_001, 3);
        let x = rng.f32s(rows * dim, -1.0, 1.0);
        let weight = rng.f32s(dim, -1.0, 1.0);
        let case = Case {
            x: &x,
            shape: &[rows, dim],
            weight: &weight,
            convention: NormWeight::Scale,
            eps: 1e-6,
            in_place: true,
        };
        // One row per workgroup: more than 65535 workgroups.
        let got = run(ctx, &case, 1);
        let expected = reference(&x, &weight, NormWeight::Scale, 1e-6);
        assert_close("rms_norm 70001 rows", &got, &expected, NORM_TOLERANCE);
    }

    #[test]
    fn mismatched_arguments_are_errors() {
        let ctx = gpu();
        let x = Tensor::empty(ctx, "x", &[4, 10]).unwrap();
        let weight = Tensor::empty(ctx, "weight", &[4]).unwrap();
        let weight_5 = Tensor::empty(ctx, "weight", &[5]).unwrap();
        let small_out = Tensor::empty(ctx, "out", &[4, 9]).unwrap();
        let mut encoder = ctx.encoder("test");
        let norm = RmsNorm { weight: &weight, convention: NormWeight::Scale, eps: 1e-6 };
        let err = rms_norm_in_place(ctx, &mut encoder, &norm, &x).unwrap_err();
        assert!(err.to_string().contains("multiple of the weight's length"), "{err}");
        let norm = RmsNorm { weight: &weight_5, ..norm };
        let err = rms_norm(ctx, &mut encoder, &norm, &x, &small_out).unwrap_err();
        assert!(err.to_string().contains("out has 36"), "{err}");
        let err = rms_norm_in_place(ctx, &mut encoder, &RmsNorm { eps: -1.0, ..norm }, &x).unwrap_err();
        assert!(err.to_string().contains("eps"), "{err}");
        let err = rms_norm(ctx, &mut encoder, &norm, &x, &x).unwrap_err();
        assert!(err.to_string().contains("also read"), "{err}");

        let x_5 = Tensor::empty(ctx, "x", &[4, 5]).unwrap();
        let (out_5, sublayer_5) =
            (Tensor::empty(ctx, "out", &[4, 5]).unwrap(), Tensor::empty(ctx, "p", &[4, 5]).unwrap());
        let err = rms_norm_residual(ctx, &mut encoder, &norm, &small_out, &x_5, None).unwrap_err();
        assert!(err.to_string().contains("the sublayer's output 36"), "{err}");
        let err =
            rms_norm_residual(ctx, &mut encoder, &norm, &sublayer_5, &x_5, Some((&norm, &x_5))).unwrap_err();
        assert!(err.to_string().contains("also read"), "{err}");
        let one_plus = RmsNorm { convention: NormWeight::OnePlus, ..norm };
        let err = rms_norm_residual(ctx, &mut encoder, &norm, &sublayer_5, &x_5, Some((&one_plus, &out_5)))
            .unwrap_err();
        assert!(err.to_string().contains("conventions"), "{err}");
        let err = rms_norm_residual(ctx, &mut encoder, &norm, &x_5, &x_5, None).unwrap_err();
        assert!(err.to_string().contains("also read"), "{err}");
    }
}
