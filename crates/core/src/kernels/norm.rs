//! RMSNorm over the last dimension (`shaders/norm.wgsl`), out of place or in place.
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
use crate::gpu::{GpuContext, KernelSource, Tensor};
use crate::kernels::ensure;

const SOURCE: &str = include_str!("../../../../shaders/norm.wgsl");
/// Invocations per workgroup of the row reductions (RMSNorm here, softmax in `elementwise`).
pub(crate) const REDUCTION_WG_SIZE: u32 = 64;

/// How many rows one workgroup of a row reduction handles, each row by its own team of lanes
/// (see `shaders/norm.wgsl`).
pub(crate) fn reduction_rows_per_workgroup(ctx: &GpuContext) -> u32 {
    if ctx.features().subgroups {
        // A team is a subgroup: as many rows as the narrowest subgroups make teams.
        REDUCTION_WG_SIZE / ctx.adapter_info().subgroup_min_size.clamp(1, REDUCTION_WG_SIZE)
    } else if ctx.adapter_info().device_type == wgpu::DeviceType::Cpu {
        // A CPU driver runs a workgroup on one core, its invocations in SIMD chunks of about 8:
        // a row is as fast on 8 lanes as on 64, and 8 rows then share each (costly) barrier.
        REDUCTION_WG_SIZE / 8
    } else {
        // A GPU: all 64 lanes on one row, so that even a single row is read in parallel.
        1
    }
}

/// How RMSNorm applies its learned weight `w` to the normalised row `x̂ = x / rms(x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    _pad: u32,
}

/// Records `out = rms_norm(x)` row by row; `out` has as many elements as `x`.
pub fn rms_norm(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
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
    encoder: &mut wgpu::CommandEncoder,
    norm: &RmsNorm<'_>,
    x: &Tensor,
) -> Result<()> {
    record(ctx, encoder, norm, x, None, reduction_rows_per_workgroup(ctx))
}

fn source(ctx: &GpuContext, convention: NormWeight, in_place: bool, rows_per_workgroup: u32) -> KernelSource {
    KernelSource::new("rms_norm", &[SOURCE])
        .define("WG_SIZE", format!("{REDUCTION_WG_SIZE}u"))
        .define("ROWS_PER_WG", format!("{rows_per_workgroup}u"))
        .define("IN_PLACE", in_place)
        .define("ONE_PLUS_WEIGHT", convention == NormWeight::OnePlus)
        .define("SUBGROUPS", ctx.features().subgroups)
}

fn record(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    norm: &RmsNorm<'_>,
    x: &Tensor,
    out: Option<&Tensor>,
    rows_per_workgroup: u32,
) -> Result<()> {
    let dim = norm.weight.len();
    let row_len = x.shape().last().copied();
    ensure("rms_norm", dim > 0 && row_len.is_some_and(|n| n.is_multiple_of(dim)), || {
        format!(
            "the weight has {dim} elements and x has shape {:?}; x's last dimension must be a \
             multiple of the weight's length (one row per weight-sized run)",
            x.shape()
        )
    })?;
    ensure("rms_norm", norm.eps.is_finite() && norm.eps >= 0.0, || {
        format!("eps is {}; it must be finite and not negative", norm.eps)
    })?;
    let written = out.unwrap_or(x);
    let read = [Some(norm.weight), out.map(|_| x)];
    ensure("rms_norm", read.into_iter().flatten().all(|input| input.buffer() != written.buffer()), || {
        "the tensor written is also read: out must be a tensor of its own, and the weight must \
         not be x"
            .to_string()
    })?;
    let rows = x.len() / dim;
    if rows == 0 {
        return Ok(());
    }
    let params = ctx.uniform(&Params { rows: rows as u32, dim: dim as u32, eps: norm.eps, _pad: 0 });
    let mut bindings = vec![params.as_entire_binding(), norm.weight.binding(), x.binding()];
    bindings.extend(out.map(Tensor::binding));
    let source = source(ctx, norm.convention, out.is_none(), rows_per_workgroup);
    ctx.dispatch(encoder, &source, &bindings, ctx.grid((rows as u32).div_ceil(rows_per_workgroup)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::testing::{POISON, Rng, assert_close, both_paths, gpu, gpu_portable, validate_wgsl};

    /// f32 sums of up to `dim / 8 + 64` squares, an `inverseSqrt` within 2 ULP and two rounded
    /// products: a few ULP (measured on lavapipe: at most 4e-7).
    const NORM_TOLERANCE: f32 = 2e-6;

    fn reference(x: &[f32], weight: &[f32], convention: NormWeight, eps: f32) -> Vec<f32> {
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
                for in_place in [false, true] {
                    for rows_per_workgroup in team_shapes(ctx) {
                        validate_wgsl(&source(ctx, convention, in_place, rows_per_workgroup));
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
    }
}
