//! Quantized matrix × vector and matrix × matrix (`shaders/matmul.wgsl`): `y = x · Wᵀ` with W
//! a [`QuantMatrix`] in any [`QuantType`], decoded inside the kernel by the type's block
//! decoder from `shaders/quant/`; f32 activations, f32 sums.

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, QuantMatrix, Tensor, UNIFORM_WINDOW_BYTES};
use crate::kernels::elementwise::{ACTIVATION_SOURCE, GatedActivation};
use crate::kernels::ensure;
use crate::kernels::norm::{NormWeight, RmsNorm};
use crate::quant::QuantType;
use crate::tuning;

const SOURCE: &str = include_str!("../../shaders/matmul.wgsl");

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    first_row: u32,
    cols: u32,
    batch: u32,
    row_words: u32,
    blocks: u32,
    out_rows: u32,
    second_row: u32,
    third_row: u32,
    /// The RMSNorm's epsilon of a normalised input.
    eps: f32,
    /// The batch row of the output that x's first row is: that of the window.
    first_batch: u32,
    /// 1 where the dispatch stores a residual input's sum (its first chunk).
    write_sum: u32,
}

/// How the partial sums of one row's invocations are added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reduce {
    /// One invocation per row: nothing to add.
    None,
    /// `subgroupShuffleXor` butterflies (the row's invocations lie in one subgroup).
    Subgroup,
    /// A tree in workgroup memory, with barriers.
    Shared,
}

/// One compiled shape of the kernel; `tuning::matmul_variant` picks the device's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Variant {
    pub(crate) wg_size: u32,
    pub(crate) threads_per_row: u32,
    /// Weight rows per invocation: each activation loaded is used this many times.
    pub(crate) row_tile: u32,
    /// Batch rows per invocation: each decoded weight is used this many times.
    pub(crate) batch_tile: u32,
    pub(crate) reduce: Reduce,
    /// Lane j of a subgroup loads the j-th 4 activations of each block of 32 and
    /// `subgroupBroadcast` hands them to all (needs subgroups of at least 8 invocations and
    /// `threads_per_row` 1, so that a whole subgroup reads the same activations).
    pub(crate) x_broadcast: bool,
    /// Some(n): x (and a gated input's up projection) are read through uniform windows of n
    /// batch rows, one dispatch a window (CPU devices: see `tuning::matmul_variant`).
    pub(crate) x_window_rows: Option<u32>,
    /// The tiled matrix × matrix kernel (TILED in matmul.wgsl): a workgroup of 256 shares
    /// decoded weights and activations through workgroup memory for a [`TILED_ROWS`] ×
    /// `batch_tile` block of the output. The other fields are ignored but `wg_size` (256).
    pub(crate) tiled: bool,
}

/// Weight rows of the tiled kernel's output block.
pub(crate) const TILED_ROWS: u32 = 64;

/// The tiled kernel for GPUs at large batches: 64 weight rows × 64 batch rows a workgroup.
pub(crate) const TILED: Variant = Variant {
    wg_size: 256,
    threads_per_row: 1,
    row_tile: 1,
    batch_tile: 64,
    reduce: Reduce::None,
    x_broadcast: false,
    x_window_rows: None,
    tiled: true,
};

impl Variant {
    /// The batch rows of x that one dispatch reads: a window's, or all of them.
    fn batch_per_dispatch(self, batch: usize) -> usize {
        self.x_window_rows.map_or(batch, |rows| rows as usize)
    }

    fn rows_per_workgroup(self) -> u32 {
        if self.tiled { TILED_ROWS } else { self.wg_size / self.threads_per_row * self.row_tile }
    }

    fn source(self, quant: QuantType, textures: bool, input: Input, outputs: Outputs) -> KernelSource {
        let cols = input.x().shape().last().copied().unwrap_or(0) as u32;
        let (gate, norm) = match input {
            Input::Plain(_) => (None, None),
            Input::Gated(gated) => (Some(gated.activation), None),
            Input::Normed(_, norm) => (None, Some(norm.convention)),
            Input::Residual(residual) => (None, Some(residual.convention)),
        };
        let family: &[&'static str] = if gate.is_some() { &[ACTIVATION_SOURCE, SOURCE] } else { &[SOURCE] };
        QuantMatrix::kernel_source(quant, textures, "matmul", family)
            .define("NORMED", norm.is_some())
            .define("NORM_ONE_PLUS", norm == Some(NormWeight::OnePlus))
            .define("RESIDUAL", matches!(input, Input::Residual(_)))
            // After y, params (3) and the other outputs.
            .define("NORM_BINDING", format!("{}u", 3 + outputs.tensors().len()))
            .define(
                "NORM_VEC4S",
                format!("{}u", cols / 4 * if matches!(input, Input::Residual(_)) { 2 } else { 1 }),
            )
            .define("GATED", gate.is_some())
            .define("GATE_SILU", gate == Some(GatedActivation::Silu))
            .define("GATE_GELU", gate == Some(GatedActivation::GeluTanh))
            .define("SPLIT", matches!(outputs, Outputs::Split(..)))
            .define("THIRD", matches!(outputs, Outputs::Split(_, _, Some(_))))
            .define("ADD_TO_OUTPUT", matches!(outputs, Outputs::AddTo(_)))
            .define("WG_SIZE", format!("{}u", self.wg_size))
            .define("THREADS_PER_ROW", format!("{}u", self.threads_per_row))
            .define("ROW_TILE", format!("{}u", self.row_tile))
            .define("BATCH_TILE", format!("{}u", self.batch_tile))
            .define("SUBGROUP_REDUCE", self.reduce == Reduce::Subgroup)
            .define("SHARED_REDUCE", self.reduce == Reduce::Shared)
            .define("TILED", self.tiled)
            .define("X_BROADCAST", self.x_broadcast)
            .define("X_UNIFORM", self.x_window_rows.is_some())
            .define("X_WINDOW_VEC4S", format!("{}u", self.x_window_rows.unwrap_or(0) * cols / 4))
            .define("WIDE", self.threads_per_row == 1)
    }
}

/// The batch rows of x with `cols` columns that a uniform window holds on this device: as many
/// as fit in `max_bytes` (at most [`UNIFORM_WINDOW_BYTES`]) and the device's uniform binding
/// size, in steps that keep each window's offset aligned as uniform bindings must be, and in
/// whole tiles of `batch_tile` rows where one fits: a window that ends inside a tile makes the
/// invocations of that tile compute rows that are thrown away (16 rows of SmolLM2's 576 × 1536
/// down projection in windows of 10 ran 5 tiles of 4, in windows of 8 run 4). None when not
/// even one step fits (x is then read from its storage buffer).
pub(crate) fn uniform_window_rows(
    ctx: &GpuContext,
    cols: usize,
    max_bytes: u64,
    batch_tile: u32,
) -> Option<u32> {
    let limits = ctx.limits();
    let bytes = max_bytes.min(UNIFORM_WINDOW_BYTES).min(limits.max_uniform_buffer_binding_size);
    let row_bytes = (cols * 4) as u64;
    let align = u64::from(limits.min_uniform_buffer_offset_alignment);
    let step = align / gcd(row_bytes, align);
    let tiled_step = step / gcd(step, u64::from(batch_tile)) * u64::from(batch_tile);
    let fitting = bytes / row_bytes;
    let rows = if fitting >= tiled_step { fitting / tiled_step * tiled_step } else { fitting / step * step };
    (rows > 0).then_some(rows as u32)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The activations of a product whose input is a gated feed-forward layer's: `activation(gate)
/// * up`, element by element, computed as the kernel loads them.
#[derive(Clone, Copy)]
pub struct GatedInput<'a> {
    /// The activation applied to the gate.
    pub activation: GatedActivation,
    /// The gate projection, `[batch, cols]`.
    pub gate: &'a Tensor,
    /// The up projection, the same shape.
    pub up: &'a Tensor,
}

/// The activations of a product that follows a sublayer whose output is normalised before it
/// joins the residual stream (Gemma 3's post-attention and post-FFN norms): row by row,
/// `norm(residual + post_norm(sublayer))`, computed as the kernel loads them, and the sum
/// `residual + post_norm(sublayer)` stored in `sum` for the layers after. One dispatch for what
/// [`crate::kernels::norm::rms_norm_residual`] and the product record in two, and one pass
/// over the activations fewer.
#[derive(Clone, Copy)]
pub struct ResidualInput<'a> {
    /// The residual stream, `[batch, cols]`.
    pub residual: &'a Tensor,
    /// The sublayer's output, the same shape.
    pub sublayer: &'a Tensor,
    /// f32 `[2, cols]`: the weight of the norm of the product's input, then the post-norm's.
    pub norm_weights: &'a Tensor,
    /// How both weights scale.
    pub convention: NormWeight,
    /// Both norms' epsilon.
    pub eps: f32,
    /// Receives `residual + post_norm(sublayer)`, the same shape; another tensor than the two
    /// inputs (the product reads them while it writes this).
    pub sum: &'a Tensor,
}

/// What a product reads as its activations.
#[derive(Clone, Copy)]
enum Input<'a> {
    Plain(&'a Tensor),
    Gated(GatedInput<'a>),
    /// `x` RMS-normalised by `norm`, row by row, as the kernel loads it.
    Normed(&'a Tensor, RmsNorm<'a>),
    Residual(ResidualInput<'a>),
}

impl<'a> Input<'a> {
    /// The tensor whose shape is the activations', bound as `x`.
    fn x(self) -> &'a Tensor {
        match self {
            Input::Plain(x) | Input::Normed(x, _) => x,
            Input::Gated(gated) => gated.gate,
            Input::Residual(residual) => residual.residual,
        }
    }

    /// The tensors read through uniform windows where the variant has them: x, and a gated
    /// input's up projection or a residual input's sublayer.
    fn windowed(self) -> Vec<&'a Tensor> {
        match self {
            Input::Plain(x) | Input::Normed(x, _) => vec![x],
            Input::Gated(gated) => vec![gated.gate, gated.up],
            Input::Residual(residual) => vec![residual.residual, residual.sublayer],
        }
    }

    fn eps(self) -> f32 {
        match self {
            Input::Normed(_, norm) => norm.eps,
            Input::Residual(residual) => residual.eps,
            Input::Plain(_) | Input::Gated(_) => 0.0,
        }
    }
}

/// Where the rows of a product go.
#[derive(Clone, Copy)]
enum Outputs<'a> {
    /// Every row to one tensor, overwriting it.
    One(&'a Tensor),
    /// Every row added to what one tensor holds.
    AddTo(&'a Tensor),
    /// The rows of each part of a stacked weight to their own tensor: two or three.
    Split(&'a Tensor, &'a Tensor, Option<&'a Tensor>),
}

impl<'a> Outputs<'a> {
    fn tensors(self) -> Vec<&'a Tensor> {
        match self {
            Outputs::One(y) | Outputs::AddTo(y) => vec![y],
            Outputs::Split(a, b, c) => [Some(a), Some(b), c].into_iter().flatten().collect(),
        }
    }
}

/// Records `y[b, r] = Σ_k weight[r, k] · x[b, k]`: x is `[.., cols]`, y is `[.., rows]` with
/// the same number of batch rows (all leading dimensions together). Batch 1 is a matrix ×
/// vector product; larger batches (prefill, batched decode) reuse each decoded weight for up
/// to 16 batch rows (64 in GPUs' tiled kernel). One dispatch per chunk of the weight.
pub fn matmul(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    x: &Tensor,
    y: &Tensor,
) -> Result<()> {
    run(ctx, encoder, weight, Input::Plain(x), Outputs::One(y), None)
}

/// Records `y[b, r] += Σ_k weight[r, k] · x[b, k]`: [`matmul`] with its products added to y, as
/// a residual connection does, in the same pass.
pub fn matmul_add(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    x: &Tensor,
    y: &Tensor,
) -> Result<()> {
    run(ctx, encoder, weight, Input::Plain(x), Outputs::AddTo(y), None)
}

/// Records `y[b, r] = Σ_k weight[r, k] · activation(gate[b, k]) · up[b, k]`: a feed-forward
/// layer's down projection with its gated activation computed in the same pass.
pub fn matmul_gated(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: &GatedInput<'_>,
    y: &Tensor,
) -> Result<()> {
    run(ctx, encoder, weight, Input::Gated(*input), Outputs::One(y), None)
}

/// [`matmul_gated`] with its products added to y (the residual connection), in the same pass.
pub fn matmul_gated_add(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: &GatedInput<'_>,
    y: &Tensor,
) -> Result<()> {
    run(ctx, encoder, weight, Input::Gated(*input), Outputs::AddTo(y), None)
}

/// Records the products of a weight stacked from two or three matrices
/// ([`QuantMatrix::upload_stacked`]) with the same x in one pass, the rows of each part into
/// its own tensor of `outputs` (in order; each `[batch, that part's rows]`).
pub fn matmul_split(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    x: &Tensor,
    outputs: &[&Tensor],
) -> Result<()> {
    run(ctx, encoder, weight, Input::Plain(x), split_outputs(outputs)?, None)
}

fn split_outputs<'a>(outputs: &[&'a Tensor]) -> Result<Outputs<'a>> {
    match *outputs {
        [a, b] => Ok(Outputs::Split(a, b, None)),
        [a, b, c] => Ok(Outputs::Split(a, b, Some(c))),
        _ => Err(crate::Error::KernelArguments {
            kernel: "matmul",
            reason: format!("a split product has 2 or 3 outputs, not {}", outputs.len()),
        }),
    }
}

/// [`matmul`] of `x` normalised by `norm` (an RMSNorm over each row of x), normalised as the
/// kernel loads it: the norm's pass over memory and its dispatch are saved.
pub fn matmul_normed(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    norm: &RmsNorm<'_>,
    x: &Tensor,
    y: &Tensor,
) -> Result<()> {
    run(ctx, encoder, weight, Input::Normed(x, *norm), Outputs::One(y), None)
}

/// [`matmul_split`] of `x` normalised by `norm`, as [`matmul_normed`] does.
pub fn matmul_split_normed(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    norm: &RmsNorm<'_>,
    x: &Tensor,
    outputs: &[&Tensor],
) -> Result<()> {
    run(ctx, encoder, weight, Input::Normed(x, *norm), split_outputs(outputs)?, None)
}

/// [`matmul`] of a residual input: `y = norm(residual + post_norm(sublayer)) · Wᵀ`, the sum
/// stored in `input.sum` (see [`ResidualInput`]).
pub fn matmul_residual(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: &ResidualInput<'_>,
    y: &Tensor,
) -> Result<()> {
    run(ctx, encoder, weight, Input::Residual(*input), Outputs::One(y), None)
}

/// [`matmul_split`] of a residual input, as [`matmul_residual`] does.
pub fn matmul_split_residual(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: &ResidualInput<'_>,
    outputs: &[&Tensor],
) -> Result<()> {
    run(ctx, encoder, weight, Input::Residual(*input), split_outputs(outputs)?, None)
}

/// Whether a product of `batch` rows should take a [`ResidualInput`] rather than a joint
/// pass before it ([`crate::kernels::norm::rms_norm_residual`]) on this device, as
/// `tuning::fuses_residual_input` decides.
pub fn fuses_residual_input(ctx: &GpuContext, batch: usize) -> bool {
    tuning::fuses_residual_input(ctx.device_class(), batch)
}

/// Checks the arguments and records the product through `variant`, or the device's choice.
fn run(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: Input,
    outputs: Outputs,
    variant: Option<Variant>,
) -> Result<()> {
    let batch = batch_rows(weight, input, outputs)?;
    let variant = variant
        .unwrap_or_else(|| tuning::matmul_variant(ctx, weight.quant(), weight.rows(), weight.cols(), batch));
    record(ctx, encoder, weight, input, outputs, batch, variant)
}

/// Checks that x and the outputs fit the weight; returns the number of batch rows.
fn batch_rows(weight: &QuantMatrix, input: Input, outputs: Outputs) -> Result<usize> {
    let (rows, cols) = (weight.rows(), weight.cols());
    let x = input.x();
    if let Input::Gated(gated) = input {
        ensure("matmul", gated.up.shape() == gated.gate.shape(), || {
            format!("gate {:?} and up {:?} must have the same shape", gated.gate.shape(), gated.up.shape())
        })?;
    }
    if let Input::Normed(_, norm) = input {
        ensure("matmul", norm.weight.shape() == [cols], || {
            format!(
                "the norm's weight is {:?}, but weight '{}' has {cols} columns",
                norm.weight.shape(),
                weight.name()
            )
        })?;
    }
    if let Input::Residual(residual) = input {
        let shape = residual.residual.shape();
        ensure(
            "matmul",
            residual.sublayer.shape() == shape
                && residual.sum.shape() == shape
                && residual.norm_weights.shape() == [2, cols],
            || {
                format!(
                    "a residual input needs the sublayer's output and the sum shaped as the residual \
                     {shape:?}, and norm weights [2, {cols}] for weight '{}'; got {:?}, {:?} and {:?}",
                    weight.name(),
                    residual.sublayer.shape(),
                    residual.sum.shape(),
                    residual.norm_weights.shape()
                )
            },
        )?;
        ensure(
            "matmul",
            !residual.sum.same_buffer(residual.residual) && !residual.sum.same_buffer(residual.sublayer),
            || "a residual input's sum must go to another tensor than the residual and the sublayer".into(),
        )?;
    }
    let batch = x.len() / cols;
    let tensors = outputs.tensors();
    let widths: Vec<usize> = match outputs {
        Outputs::Split(..) => weight.part_rows().to_vec(),
        Outputs::One(_) | Outputs::AddTo(_) => vec![rows],
    };
    let fits = tensors.len() == widths.len()
        && tensors.iter().zip(&widths).all(|(y, &w)| y.shape().last() == Some(&w) && y.len() == batch * w);
    ensure("matmul", x.shape().last() == Some(&cols) && batch > 0 && fits, || {
        format!(
            "weight '{}' is {rows} x {cols} (parts of {widths:?} rows), so x must be [batch, {cols}] \
             and the outputs [batch, rows of each part] with batch >= 1; got x {:?} and outputs {:?}",
            weight.name(),
            x.shape(),
            tensors.iter().map(|y| y.shape()).collect::<Vec<_>>()
        )
    })?;
    Ok(batch)
}

fn record(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: Input,
    outputs: Outputs,
    batch: usize,
    variant: Variant,
) -> Result<()> {
    let per_dispatch = variant.batch_per_dispatch(batch);
    let batch_tiles = per_dispatch.min(batch).div_ceil(variant.batch_tile as usize);
    let max_groups = ctx.limits().max_compute_workgroups_per_dimension as usize;
    ensure("matmul", batch_tiles <= max_groups, || {
        format!(
            "batch {batch} needs {batch_tiles} workgroups in z, more than the device's {max_groups}: split it"
        )
    })?;
    let cols = weight.cols();
    let window_bytes = variant.x_window_rows.map(|rows| (rows as usize * cols * 4) as u64);
    if let Some(bytes) = window_bytes {
        let limits = ctx.limits();
        let inputs = input.windowed();
        ensure(
            "matmul",
            bytes <= limits.max_uniform_buffer_binding_size
                && bytes % u64::from(limits.min_uniform_buffer_offset_alignment) == 0
                && inputs.iter().all(|x| x.window_padding() >= bytes),
            || {
                format!(
                    "a uniform window of {bytes} bytes must fit the device's uniform bindings ({} bytes, \
                     offsets aligned to {}) and the padding of x's buffer",
                    limits.max_uniform_buffer_binding_size, limits.min_uniform_buffer_offset_alignment
                )
            },
        )?;
    }
    let source = variant.source(weight.quant(), weight.in_textures(), input, outputs);
    let tensors = outputs.tensors();
    let (second_row, third_row) = match weight.part_rows() {
        [a, b, ..] if tensors.len() > 1 => (*a, a + b),
        _ => (weight.rows(), weight.rows()),
    };
    // x as bound: the window from byte `offset` on, or the whole tensor.
    fn x_binding(x: &Tensor, offset: u64, window_bytes: Option<u64>) -> wgpu::BindingResource<'_> {
        match window_bytes {
            Some(bytes) => x.window_binding(offset, bytes),
            None => x.binding(),
        }
    }
    for (chunk_index, chunk) in weight.chunks().iter().enumerate() {
        let [gx, gy, _] = ctx.grid((chunk.rows as u32).div_ceil(variant.rows_per_workgroup()));
        for first_batch in (0..batch).step_by(per_dispatch) {
            let rows_here = per_dispatch.min(batch - first_batch);
            let x_offset = (first_batch * cols * 4) as u64;
            let params = encoder.params(
                ctx,
                &Params {
                    rows: chunk.rows as u32,
                    first_row: chunk.first_row as u32,
                    cols: cols as u32,
                    batch: rows_here as u32,
                    row_words: weight.row_words() as u32,
                    blocks: (cols / weight.quant().block_elements()) as u32,
                    out_rows: weight.rows() as u32,
                    second_row: second_row as u32,
                    third_row: third_row as u32,
                    eps: input.eps(),
                    first_batch: first_batch as u32,
                    write_sum: u32::from(chunk_index == 0),
                },
            )?;
            let mut bindings = vec![
                chunk.binding(),
                x_binding(input.x(), x_offset, window_bytes),
                tensors[0].binding(),
                params.binding(),
            ];
            // From binding 4 on: the split outputs, then the up projection of a gated input, or
            // the norm's weight (a residual input's two, then its sublayer and sum).
            bindings.extend(tensors[1..].iter().map(|y| y.binding()));
            match input {
                Input::Gated(gated) => bindings.push(x_binding(gated.up, x_offset, window_bytes)),
                Input::Normed(_, norm) => bindings.push(norm.weight.binding()),
                Input::Residual(residual) => bindings.extend([
                    residual.norm_weights.binding(),
                    x_binding(residual.sublayer, x_offset, window_bytes),
                    residual.sum.binding(),
                ]),
                Input::Plain(_) => {}
            }
            let groups = [gx, gy, rows_here.div_ceil(variant.batch_tile as usize) as u32];
            ctx.dispatch(encoder, &source, &bindings, groups)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{DeviceClass, GpuContext};
    use crate::kernels::norm::tests::reference as norm_reference;
    use crate::kernels::testing::{POISON, Rng, both_paths, gpu, validate_wgsl};
    use crate::quant::{dequantize_row, random_rows};

    /// Every variant a test forces: the devices' own choices come on top. TPR 4 and 8 with
    /// subgroup shuffles and the activation broadcast fit lavapipe's subgroups of 8. Row tiles
    /// of 3 and 8 leave partial tiles on every test shape.
    const FORCED: [Variant; 9] = [
        TILED,
        Variant {
            wg_size: 64,
            threads_per_row: 1,
            row_tile: 1,
            batch_tile: 8,
            reduce: Reduce::None,
            x_broadcast: false,
            x_window_rows: None,
            tiled: false,
        },
        Variant {
            wg_size: 32,
            threads_per_row: 4,
            row_tile: 1,
            batch_tile: 4,
            reduce: Reduce::Shared,
            x_broadcast: false,
            x_window_rows: None,
            tiled: false,
        },
        Variant {
            wg_size: 128,
            threads_per_row: 32,
            row_tile: 1,
            batch_tile: 8,
            reduce: Reduce::Shared,
            x_broadcast: false,
            x_window_rows: None,
            tiled: false,
        },
        Variant {
            wg_size: 64,
            threads_per_row: 8,
            row_tile: 1,
            batch_tile: 4,
            reduce: Reduce::Subgroup,
            x_broadcast: false,
            x_window_rows: None,
            tiled: false,
        },
        Variant {
            wg_size: 64,
            threads_per_row: 1,
            row_tile: 8,
            batch_tile: 16,
            reduce: Reduce::None,
            x_broadcast: false,
            x_window_rows: None,
            tiled: false,
        },
        Variant {
            wg_size: 16,
            threads_per_row: 1,
            row_tile: 3,
            batch_tile: 4,
            reduce: Reduce::None,
            x_broadcast: true,
            x_window_rows: None,
            tiled: false,
        },
        Variant {
            wg_size: 64,
            threads_per_row: 1,
            row_tile: 8,
            batch_tile: 16,
            reduce: Reduce::None,
            x_broadcast: true,
            x_window_rows: None,
            tiled: false,
        },
        Variant {
            wg_size: 32,
            threads_per_row: 1,
            row_tile: 2,
            batch_tile: 8,
            reduce: Reduce::None,
            x_broadcast: true,
            x_window_rows: None,
            tiled: false,
        },
    ];

    /// Error bound, relative to the sum of magnitudes `Σ_k |W[r, k] x[b, k]|` of each output
    /// (the condition of a dot product: a plain relative error is meaningless for a sum that
    /// cancels to near zero). The GPU decodes with the same f32 operations as `dequantize_row`
    /// up to fused multiply-adds, so what is left is f32 summation of a few thousand terms,
    /// measured below 2e-7 on random data; one wrong weight among n costs about 1 / n, far above.
    const TOLERANCE: f64 = 2e-6;

    /// Columns for a type: several blocks, not a power of two.
    fn test_cols(quant: QuantType) -> usize {
        match quant.block_elements() {
            1 => 8 * 29,
            32 => 32 * 5,
            _ => 256 * 3,
        }
    }

    /// The f64 product of the dequantized weight with each batch row of x, and each output's
    /// sum of magnitudes.
    fn reference(
        quant: QuantType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        x: &[f32],
    ) -> (Vec<f64>, Vec<f64>) {
        let row_bytes = quant.row_bytes(cols).unwrap();
        let mut w = vec![0.0f32; rows * cols];
        for (r, out) in w.chunks_exact_mut(cols).enumerate() {
            dequantize_row(quant, &bytes[r * row_bytes..(r + 1) * row_bytes], out).unwrap();
        }
        let (mut y, mut magnitude) = (Vec::new(), Vec::new());
        for xb in x.chunks_exact(cols) {
            for wr in w.chunks_exact(cols) {
                let terms = xb.iter().zip(wr).map(|(&a, &w)| f64::from(a) * f64::from(w));
                y.push(terms.clone().sum());
                magnitude.push(terms.map(f64::abs).sum());
            }
        }
        (y, magnitude)
    }

    /// Asserts every output is within [`TOLERANCE`] of the reference; names the first that is not.
    fn assert_dot_close(what: &str, got: &[f32], expected: &[f64], magnitude: &[f64]) {
        assert_eq!(got.len(), expected.len(), "{what}: length");
        let mut worst = 0.0f64;
        for (i, ((&g, &e), &m)) in got.iter().zip(expected).zip(magnitude).enumerate() {
            let err = (f64::from(g) - e).abs() / m.max(f64::MIN_POSITIVE);
            assert!(
                err <= TOLERANCE,
                "{what}: output {i} of {}: got {g}, expected {e} (error {err:.3e} of the magnitude {m:.3e} > {TOLERANCE:.0e})",
                got.len()
            );
            worst = worst.max(err);
        }
        eprintln!("{what}: worst error {worst:.3e} of the magnitude");
    }

    /// The forced variants that this device runs, and a twin of each one that broadcasts x reading
    /// x through windows of about 3 batch rows (so that 17 rows take several dispatches, the last
    /// one partial), where the device's alignment of uniform bindings allows it at `cols`.
    fn forced(ctx: &GpuContext, cols: usize) -> Vec<Variant> {
        let runs =
            |v: &Variant| !((v.reduce == Reduce::Subgroup || v.x_broadcast) && !ctx.features().subgroups);
        let variants: Vec<Variant> = FORCED.into_iter().filter(runs).collect();
        let windowed = variants.iter().filter(|v| v.x_broadcast).filter_map(|v| {
            let rows = uniform_window_rows(ctx, cols, 3 * 4 * cols as u64, 1)?;
            Some(Variant { x_window_rows: Some(rows), ..*v })
        });
        let windowed: Vec<Variant> = windowed.collect();
        assert!(
            !ctx.features().subgroups || ctx.device_class() != DeviceClass::Cpu || !windowed.is_empty(),
            "no windowed variant at {cols} columns"
        );
        variants.into_iter().chain(windowed).collect()
    }

    /// Runs one product through `variant` (or the device's own choice) and checks it; returns
    /// the number of chunks the weight was split into.
    #[allow(clippy::too_many_arguments)]
    fn check(
        ctx: &GpuContext,
        quant: QuantType,
        rows: usize,
        cols: usize,
        batch: usize,
        max_chunk_bytes: u64,
        variant: Option<Variant>,
        rng: &mut Rng,
    ) -> usize {
        let bytes = random_rows(quant, rows, cols, rng);
        let x = rng.f32s(batch * cols, -1.0, 1.0);
        let weight =
            QuantMatrix::upload_in_chunks(ctx, "w", quant, rows, cols, &bytes, max_chunk_bytes).unwrap();
        let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
        let y_gpu = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
        y_gpu.fill_bits(ctx, POISON);
        let mut encoder = ctx.encoder("test");
        run(ctx, &mut encoder, &weight, Input::Plain(&x_gpu), Outputs::One(&y_gpu), variant).unwrap();
        ctx.submit(encoder).unwrap();
        let got = pollster::block_on(y_gpu.to_f32(ctx)).unwrap();
        let what =
            format!("{quant} {rows}x{cols} batch {batch}, {} chunks, {variant:?}", weight.chunk_count());
        let (expected, magnitude) = reference(quant, rows, cols, &bytes, &x);
        assert_dot_close(&what, &got, &expected, &magnitude);
        weight.chunk_count()
    }

    /// Every type through the devices' own variants and the forced ones, on awkward shapes.
    fn matmul_matches_reference(quant: QuantType) {
        let mut rng = Rng::new(&format!("matmul {quant}"));
        let cols = test_cols(quant);
        for (path, ctx) in both_paths() {
            eprintln!("{path}");
            for (rows, batch) in [(1, 1), (7, 3), (67, 17), (259, 1), (259, 5)] {
                check(ctx, quant, rows, cols, batch, u64::MAX, None, &mut rng);
            }
        }
        let ctx = gpu();
        for variant in forced(ctx, cols) {
            // The tiled kernel also over more than one block of 64 x 64.
            let more = variant.tiled.then_some((130, 70));
            for (rows, batch) in [(7, 1), (67, 17)].into_iter().chain(more) {
                check(ctx, quant, rows, cols, batch, u64::MAX, Some(variant), &mut rng);
            }
        }
    }

    macro_rules! per_type {
        ($($name:ident: $quant:expr,)*) => {$(
            #[test]
            fn $name() {
                matmul_matches_reference($quant);
            }
        )*};
    }

    per_type! {
        matmul_f32: QuantType::F32,
        matmul_f16: QuantType::F16,
        matmul_bf16: QuantType::BF16,
        matmul_q4_0: QuantType::Q4_0,
        matmul_q4_1: QuantType::Q4_1,
        matmul_q5_0: QuantType::Q5_0,
        matmul_q5_1: QuantType::Q5_1,
        matmul_q8_0: QuantType::Q8_0,
        matmul_q4_k: QuantType::Q4K,
        matmul_q5_k: QuantType::Q5K,
        matmul_q6_k: QuantType::Q6K,
    }

    /// Uniform windows are the most rows that fit the device's binding with every window's
    /// offset aligned, in whole batch tiles wherever one fits (found here by trying every row
    /// count): on SmolLM2's and gemma3's row widths, narrow ones, one whose window holds a single
    /// row and one too wide for any.
    #[test]
    fn uniform_windows_hold_whole_tiles() {
        let ctx = gpu();
        let limits = ctx.limits();
        let align = u64::from(limits.min_uniform_buffer_offset_alignment);
        let bytes = UNIFORM_WINDOW_BYTES.min(limits.max_uniform_buffer_binding_size);
        for cols in [8, 56, 576, 640, 1536, 2048, 8200, 20000] {
            let row_bytes = 4 * cols as u64;
            let aligned: Vec<u64> =
                (1..=bytes / row_bytes).filter(|k| (k * row_bytes).is_multiple_of(align)).collect();
            for batch_tile in [1, 3, 4, 8, 16] {
                let whole_tiles = aligned.iter().filter(|&&k| k.is_multiple_of(u64::from(batch_tile))).max();
                let expected = whole_tiles.or(aligned.iter().max()).map(|&k| k as u32);
                let rows = uniform_window_rows(ctx, cols, UNIFORM_WINDOW_BYTES, batch_tile);
                assert_eq!(rows, expected, "{cols} columns, batch tile {batch_tile}");
            }
        }
    }

    /// Products of RMS-normalised activations, against the norm then the product in f64: both
    /// conventions, one output and split outputs, the devices' own variants and the forced ones
    /// (whose sums of squares are reduced across invocations like the products).
    #[test]
    fn normed_input_matches_reference() {
        let mut rng = Rng::new("matmul normed");
        let eps = 1e-5f32;
        // F16 rows end in columns past the last block of 32, which every lane loads whole.
        let mut cases: Vec<(QuantType, &str, &GpuContext, Option<Variant>)> = Vec::new();
        for quant in [QuantType::Q4_1, QuantType::F16] {
            cases.extend(both_paths().into_iter().map(|(path, ctx)| (quant, path, ctx, None)));
            let ctx = gpu();
            cases.extend(forced(ctx, test_cols(quant)).into_iter().map(|v| (quant, "forced", ctx, Some(v))));
        }
        for (quant, path, ctx, variant) in cases {
            let cols = test_cols(quant);
            for (convention, (rows, batch)) in [(NormWeight::Scale, (67, 1)), (NormWeight::OnePlus, (7, 17))]
            {
                let bytes = random_rows(quant, rows, cols, &mut rng);
                let weight = QuantMatrix::upload_parts(ctx, "w", quant, cols, &[&bytes], u64::MAX).unwrap();
                // Rows of x at different scales: the norm must take each row's own.
                let mut x = rng.f32s(batch * cols, -1.0, 1.0);
                for (b, row) in x.chunks_exact_mut(cols).enumerate() {
                    row.iter_mut().for_each(|v| *v *= 0.25 + 3.0 * b as f32);
                }
                let gamma = rng.f32s(cols, -2.0, 2.0);
                let normed = norm_reference(&x, &gamma, convention, eps);
                let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
                let gamma_gpu = Tensor::from_slice(ctx, "gamma", &[cols], &gamma).unwrap();
                let norm = RmsNorm { weight: &gamma_gpu, convention, eps };
                let y = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
                y.fill_bits(ctx, POISON);
                let mut encoder = ctx.encoder("test");
                run(ctx, &mut encoder, &weight, Input::Normed(&x_gpu, norm), Outputs::One(&y), variant)
                    .unwrap();
                ctx.submit(encoder).unwrap();
                let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                let (expected, magnitude) = reference(quant, rows, cols, &bytes, &normed);
                let what = format!("{path} normed {convention:?} {rows}x{cols} batch {batch} {variant:?}");
                assert_dot_close(&what, &got, &expected, &magnitude);
            }
            // Split outputs of a stacked weight, through the public function.
            if variant.is_none() {
                let parts: Vec<Vec<u8>> =
                    [5usize, 9, 3].iter().map(|&r| random_rows(quant, r, cols, &mut rng)).collect();
                let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                let weight = QuantMatrix::upload_parts(ctx, "w", quant, cols, &slices, u64::MAX).unwrap();
                let x = rng.f32s(2 * cols, -3.0, 3.0);
                let gamma = rng.f32s(cols, -1.0, 1.0);
                let x_gpu = Tensor::from_slice(ctx, "x", &[2, cols], &x).unwrap();
                let gamma_gpu = Tensor::from_slice(ctx, "gamma", &[cols], &gamma).unwrap();
                let norm = RmsNorm { weight: &gamma_gpu, convention: NormWeight::Scale, eps };
                let ys: Vec<Tensor> =
                    [5, 9, 3].iter().map(|&r| Tensor::empty(ctx, "y", &[2, r]).unwrap()).collect();
                let mut encoder = ctx.encoder("test");
                matmul_split_normed(
                    ctx,
                    &mut encoder,
                    &weight,
                    &norm,
                    &x_gpu,
                    &ys.iter().collect::<Vec<_>>(),
                )
                .unwrap();
                ctx.submit(encoder).unwrap();
                let normed = norm_reference(&x, &gamma, NormWeight::Scale, eps);
                for (p, (y, bytes)) in ys.iter().zip(&parts).enumerate() {
                    let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                    let (expected, magnitude) =
                        reference(quant, bytes.len() / quant.row_bytes(cols).unwrap(), cols, bytes, &normed);
                    assert_dot_close(&format!("{path} normed split part {p}"), &got, &expected, &magnitude);
                }
                // A norm weight of the wrong length is refused.
                let short = Tensor::from_slice(ctx, "gamma", &[cols - 8], &gamma[..cols - 8]).unwrap();
                let bad = RmsNorm { weight: &short, convention: NormWeight::Scale, eps };
                let err =
                    matmul_normed(ctx, &mut ctx.encoder("test"), &weight, &bad, &x_gpu, &ys[0]).unwrap_err();
                assert!(err.to_string().contains("norm's weight"), "{err}");
            }
        }
    }

    /// Products of residual inputs (a post-normed sublayer added to the residual, the sum
    /// normalised), against the post-norm, the add, the norm and the product in f64, and the sum
    /// each stores: both conventions, one output and three split outputs of a weight in several
    /// chunks, the devices' own variants and the forced ones.
    #[test]
    fn residual_input_matches_reference() {
        let mut rng = Rng::new("matmul residual");
        let eps = 1e-6f32;
        // F16 rows end in columns past the last block of 32, loaded apart from the blocks.
        let mut cases: Vec<(QuantType, &str, &GpuContext, Option<Variant>)> = Vec::new();
        for quant in [QuantType::Q8_0, QuantType::F16] {
            cases.extend(both_paths().into_iter().map(|(path, ctx)| (quant, path, ctx, None)));
            let ctx = gpu();
            cases.extend(forced(ctx, test_cols(quant)).into_iter().map(|v| (quant, "forced", ctx, Some(v))));
        }
        for (quant, path, ctx, variant) in cases {
            let cols = test_cols(quant);
            let shapes = [(NormWeight::Scale, 67, 1, false), (NormWeight::OnePlus, 7, 17, false)];
            // Three parts in chunks of about 4 rows (the sum is stored by the first chunk's
            // dispatch), through the public function.
            let split = (NormWeight::Scale, 15, 5, true);
            for (convention, rows, batch, split) in
                shapes.into_iter().chain(variant.is_none().then_some(split))
            {
                let bytes = random_rows(quant, rows, cols, &mut rng);
                let chunk = if split { 4 * quant.row_bytes(cols).unwrap() as u64 } else { u64::MAX };
                let row_bytes = quant.row_bytes(cols).unwrap();
                let part_rows: Vec<usize> = if split { vec![5, 5, rows - 10] } else { vec![rows] };
                let parts: Vec<&[u8]> = part_rows
                    .iter()
                    .scan(0, |first, r| {
                        *first += r;
                        Some(&bytes[(*first - r) * row_bytes..*first * row_bytes])
                    })
                    .collect();
                let weight = QuantMatrix::upload_parts(ctx, "w", quant, cols, &parts, chunk).unwrap();
                // The residual and the sublayer at different scales in every row.
                let mut residual = rng.f32s(batch * cols, -1.0, 1.0);
                let mut sublayer = rng.f32s(batch * cols, -1.0, 1.0);
                for b in 0..batch {
                    residual[b * cols..(b + 1) * cols].iter_mut().for_each(|v| *v *= 0.5 + 2.0 * b as f32);
                    sublayer[b * cols..(b + 1) * cols].iter_mut().for_each(|v| *v *= 3.0 / (1.0 + b as f32));
                }
                let (pre, post) = (rng.f32s(cols, -2.0, 2.0), rng.f32s(cols, -2.0, 2.0));
                let post_normed = norm_reference(&sublayer, &post, convention, eps);
                let sum: Vec<f32> = residual.iter().zip(&post_normed).map(|(a, b)| a + b).collect();
                let normed = norm_reference(&sum, &pre, convention, eps);

                let tensor = |name, shape: &[usize], values: &[f32]| {
                    Tensor::from_slice(ctx, name, shape, values).unwrap()
                };
                let residual_gpu = tensor("residual", &[batch, cols], &residual);
                let sublayer_gpu = tensor("sublayer", &[batch, cols], &sublayer);
                let norms = tensor("norms", &[2, cols], &[pre.clone(), post.clone()].concat());
                let sum_gpu = Tensor::empty(ctx, "sum", &[batch, cols]).unwrap();
                sum_gpu.fill_bits(ctx, POISON);
                let input = ResidualInput {
                    residual: &residual_gpu,
                    sublayer: &sublayer_gpu,
                    norm_weights: &norms,
                    convention,
                    eps,
                    sum: &sum_gpu,
                };
                let ys: Vec<Tensor> =
                    part_rows.iter().map(|&r| Tensor::empty(ctx, "y", &[batch, r]).unwrap()).collect();
                ys.iter().for_each(|y| y.fill_bits(ctx, POISON));
                let mut encoder = ctx.encoder("test");
                if split {
                    matmul_split_residual(ctx, &mut encoder, &weight, &input, &ys.iter().collect::<Vec<_>>())
                        .unwrap();
                } else {
                    run(ctx, &mut encoder, &weight, Input::Residual(input), Outputs::One(&ys[0]), variant)
                        .unwrap();
                }
                ctx.submit(encoder).unwrap();
                let what = format!(
                    "{path} residual {convention:?} {rows}x{cols} batch {batch}, {} chunks, {variant:?}",
                    weight.chunk_count()
                );
                let got_sum = pollster::block_on(sum_gpu.to_f32(ctx)).unwrap();
                crate::kernels::testing::assert_close(&format!("{what}: sum"), &got_sum, &sum, 1e-5);
                for (i, ((y, r), part)) in ys.iter().zip(&part_rows).zip(&parts).enumerate() {
                    let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                    let (expected, magnitude) = reference(quant, *r, cols, part, &normed);
                    assert_dot_close(&format!("{what}: part {i}"), &got, &expected, &magnitude);
                }
                // The sum may not overwrite an input; norm weights must be [2, cols].
                let bad = ResidualInput { sum: &residual_gpu, ..input };
                let err = matmul_residual(ctx, &mut ctx.encoder("test"), &weight, &bad, &ys[0]);
                assert!(err.is_err_and(|e| e.to_string().contains("another tensor")));
                let bad = ResidualInput { norm_weights: &sublayer_gpu, ..input };
                let err = matmul_residual(ctx, &mut ctx.encoder("test"), &weight, &bad, &ys[0]);
                assert!(err.is_err_and(
                    |e| e.to_string().contains("norm weights [2, ") && !e.to_string().contains("  ")
                ));
            }
        }
    }

    #[test]
    fn split_weights_cover_every_row() {
        let mut rng = Rng::new("matmul split");
        for (path, ctx) in both_paths() {
            eprintln!("{path}");
            for quant in [QuantType::Q8_0, QuantType::Q6K, QuantType::Q4K, QuantType::F16] {
                let cols = test_cols(quant);
                // About 20 rows a chunk (repacked rows are up to 2 bytes longer): 259 rows make
                // 13 or 14 chunks, the last one partial.
                let chunk = 20 * quant.row_bytes(cols).unwrap() as u64 + 3;
                for batch in [1, 3, 17] {
                    let chunks = check(ctx, quant, 259, cols, batch, chunk, None, &mut rng);
                    assert!(chunks >= 13, "{quant}: {chunks} chunks");
                }
            }
        }
    }

    #[test]
    fn long_rows_stay_within_bound() {
        let mut rng = Rng::new("matmul long rows");
        for (path, ctx) in both_paths() {
            eprintln!("{path}");
            check(ctx, QuantType::Q4K, 33, 256 * 24, 2, u64::MAX, None, &mut rng);
            check(ctx, QuantType::Q8_0, 33, 32 * 181, 1, u64::MAX, None, &mut rng);
        }
    }

    /// Stacked weights of two and three parts, split into chunks that straddle the parts, each
    /// part's rows in its own output; and products added to what the output held. Through the
    /// device's own variant and the tiled kernel.
    #[test]
    fn split_and_added_outputs_match_reference() {
        let mut rng = Rng::new("matmul split outputs");
        let ctx = gpu();
        // The device's own variant, the tiled kernel that GPUs take at large batches, and the
        // forced variants' windowed ones (the windows' offsets move the gated input's up
        // projection and the outputs' batch rows too).
        for (quant, variant) in
            [QuantType::Q4_1, QuantType::Q8_0, QuantType::Q6K].into_iter().flat_map(|quant| {
                let windowed =
                    forced(gpu(), test_cols(quant)).into_iter().filter(|v| v.x_window_rows.is_some());
                [(quant, None), (quant, Some(TILED))]
                    .into_iter()
                    .chain(windowed.map(move |v| (quant, Some(v))))
            })
        {
            let cols = test_cols(quant);
            for part_rows in [&[5usize, 19][..], &[33, 7, 7]] {
                for (batch, max_chunk_bytes) in
                    [(1, u64::MAX), (17, 9 * quant.row_bytes(cols).unwrap() as u64)]
                {
                    let parts: Vec<Vec<u8>> =
                        part_rows.iter().map(|&r| random_rows(quant, r, cols, &mut rng)).collect();
                    let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                    let weight =
                        QuantMatrix::upload_parts(ctx, "w", quant, cols, &slices, max_chunk_bytes).unwrap();
                    let x = rng.f32s(batch * cols, -1.0, 1.0);
                    let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
                    let ys: Vec<Tensor> =
                        part_rows.iter().map(|&r| Tensor::empty(ctx, "y", &[batch, r]).unwrap()).collect();
                    ys.iter().for_each(|y| y.fill_bits(ctx, POISON));
                    let mut encoder = ctx.encoder("test");
                    let outputs = split_outputs(&ys.iter().collect::<Vec<_>>()).unwrap();
                    run(ctx, &mut encoder, &weight, Input::Plain(&x_gpu), outputs, variant).unwrap();
                    ctx.submit(encoder).unwrap();
                    for (p, (y, bytes)) in ys.iter().zip(&parts).enumerate() {
                        let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                        let (expected, magnitude) = reference(quant, part_rows[p], cols, bytes, &x);
                        let what = format!(
                            "{quant} parts {part_rows:?} part {p}, batch {batch}, {} chunks, {variant:?}",
                            weight.chunk_count()
                        );
                        assert_dot_close(&what, &got, &expected, &magnitude);
                    }
                }
            }
            // y = (activation(gate) * up)·Wᵀ, and y += the same, for both activations.
            let (rows, batch) = (37, 6);
            let bytes = random_rows(quant, rows, cols, &mut rng);
            let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes).unwrap();
            for activation in [GatedActivation::Silu, GatedActivation::GeluTanh] {
                let gate = rng.f32s(batch * cols, -6.0, 6.0);
                let up = rng.f32s(batch * cols, -1.0, 1.0);
                let x: Vec<f32> = gate
                    .iter()
                    .zip(&up)
                    .map(|(&g, &u)| {
                        let g = f64::from(g);
                        let activated = match activation {
                            GatedActivation::Silu => g / (1.0 + (-g).exp()),
                            GatedActivation::GeluTanh => {
                                0.5 * g * (1.0 + (0.7978845608028654 * (g + 0.044715 * g * g * g)).tanh())
                            }
                        };
                        (activated * f64::from(u)) as f32
                    })
                    .collect();
                let gate_gpu = Tensor::from_slice(ctx, "gate", &[batch, cols], &gate).unwrap();
                let up_gpu = Tensor::from_slice(ctx, "up", &[batch, cols], &up).unwrap();
                let y = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
                y.fill_bits(ctx, POISON);
                let mut encoder = ctx.encoder("test");
                let input = GatedInput { activation, gate: &gate_gpu, up: &up_gpu };
                run(ctx, &mut encoder, &weight, Input::Gated(input), Outputs::One(&y), variant).unwrap();
                ctx.submit(encoder).unwrap();
                let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                let (expected, magnitude) = reference(quant, rows, cols, &bytes, &x);
                let what = format!("{quant} gated {activation:?}, {variant:?}");
                assert_dot_close(&what, &got, &expected, &magnitude);

                let before = rng.f32s(batch * rows, -4.0, 4.0);
                let y = Tensor::from_slice(ctx, "y", &[batch, rows], &before).unwrap();
                let mut encoder = ctx.encoder("test");
                run(ctx, &mut encoder, &weight, Input::Gated(input), Outputs::AddTo(&y), variant).unwrap();
                ctx.submit(encoder).unwrap();
                let got = pollster::block_on(y.to_f32(ctx)).unwrap();
                let (expected, magnitude) = added(&expected, &magnitude, &before);
                assert_dot_close(&format!("{what} added"), &got, &expected, &magnitude);
            }

            // y += x·Wᵀ.
            let bytes = random_rows(quant, rows, cols, &mut rng);
            let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes).unwrap();
            let x = rng.f32s(batch * cols, -1.0, 1.0);
            let before = rng.f32s(batch * rows, -4.0, 4.0);
            let x_gpu = Tensor::from_slice(ctx, "x", &[batch, cols], &x).unwrap();
            let y = Tensor::from_slice(ctx, "y", &[batch, rows], &before).unwrap();
            let mut encoder = ctx.encoder("test");
            run(ctx, &mut encoder, &weight, Input::Plain(&x_gpu), Outputs::AddTo(&y), variant).unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(y.to_f32(ctx)).unwrap();
            let (product, magnitude) = reference(quant, rows, cols, &bytes, &x);
            let (expected, magnitude) = added(&product, &magnitude, &before);
            assert_dot_close(&format!("{quant} added, {variant:?}"), &got, &expected, &magnitude);
        }
    }

    /// The reference of a product added to `before`, and its magnitudes.
    fn added(product: &[f64], magnitude: &[f64], before: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let sum = product.iter().zip(before).map(|(p, &b)| p + f64::from(b)).collect();
        let magnitude = magnitude.iter().zip(before).map(|(m, &b)| m + f64::from(b).abs()).collect();
        (sum, magnitude)
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let ctx = gpu();
        let mut rng = Rng::new("matmul shapes");
        let bytes = random_rows(QuantType::Q8_0, 7, 64, &mut rng);
        let weight = QuantMatrix::upload(ctx, "w", QuantType::Q8_0, 7, 64, &bytes).unwrap();
        let x = Tensor::empty(ctx, "x", &[3, 64]).unwrap();
        for y_shape in [[3usize, 8], [2, 7]] {
            let y = Tensor::empty(ctx, "y", &y_shape).unwrap();
            let err = matmul(ctx, &mut ctx.encoder("test"), &weight, &x, &y).unwrap_err();
            assert!(err.to_string().contains("'w' is 7 x 64"), "{err}");
        }
        let x = Tensor::empty(ctx, "x", &[3, 32]).unwrap();
        let y = Tensor::empty(ctx, "y", &[3, 7]).unwrap();
        assert!(matmul(ctx, &mut ctx.encoder("test"), &weight, &x, &y).is_err());
        // Split outputs must match the stacked parts, in number and in rows.
        let stacked = QuantMatrix::upload_stacked(
            ctx,
            "qkv",
            QuantType::Q8_0,
            64,
            &[&bytes[..2 * 68], &bytes[2 * 68..]],
        )
        .unwrap();
        let x = Tensor::empty(ctx, "x", &[3, 64]).unwrap();
        let (y2, y5, y7) = (
            Tensor::empty(ctx, "a", &[3, 2]).unwrap(),
            Tensor::empty(ctx, "b", &[3, 5]).unwrap(),
            Tensor::empty(ctx, "c", &[3, 7]).unwrap(),
        );
        assert!(matmul_split(ctx, &mut ctx.encoder("test"), &stacked, &x, &[&y2, &y5]).is_ok());
        for outputs in [&[&y5, &y2][..], &[&y2, &y5, &y5], &[&y7]] {
            let err = matmul_split(ctx, &mut ctx.encoder("test"), &stacked, &x, outputs).unwrap_err();
            assert!(err.to_string().contains("'qkv'") || err.to_string().contains("2 or 3"), "{err}");
        }
        assert!(matmul_split(ctx, &mut ctx.encoder("test"), &weight, &x, &[&y2, &y5]).is_err());
    }

    #[test]
    fn every_variant_validates() {
        let y = Tensor::empty(gpu(), "y", &[1, 8]).unwrap();
        for quant in QuantType::ALL {
            let mut variants = FORCED.to_vec();
            for batch_tile in [1, 4, 8, 16] {
                for (row_tile, x_broadcast, x_window_rows) in [
                    (1, false, None),
                    (2, false, None),
                    (4, false, None),
                    (8, false, None),
                    (4, true, None),
                    (8, true, None),
                    (4, false, Some(3)),
                    (4, true, Some(3)),
                ] {
                    variants.push(Variant {
                        wg_size: 64,
                        threads_per_row: 1,
                        row_tile,
                        batch_tile,
                        reduce: Reduce::None,
                        x_broadcast,
                        x_window_rows,
                        tiled: false,
                    });
                }
                for threads_per_row in [4, 8, 16, 32] {
                    variants.push(Variant {
                        wg_size: 128,
                        threads_per_row,
                        row_tile: 1,
                        batch_tile,
                        reduce: Reduce::Subgroup,
                        x_broadcast: false,
                        x_window_rows: None,
                        tiled: false,
                    });
                }
                variants.push(Variant {
                    wg_size: 128,
                    threads_per_row: 32,
                    row_tile: 1,
                    batch_tile,
                    reduce: Reduce::Shared,
                    x_broadcast: false,
                    x_window_rows: None,
                    tiled: false,
                });
            }
            for (variant, textures) in variants.into_iter().flat_map(|v| [(v, false), (v, true)]) {
                let plain = Input::Plain(&y);
                validate_wgsl(&variant.source(quant, textures, plain, Outputs::One(&y)));
                validate_wgsl(&variant.source(quant, textures, plain, Outputs::Split(&y, &y, None)));
                validate_wgsl(&variant.source(quant, textures, plain, Outputs::Split(&y, &y, Some(&y))));
                for activation in [GatedActivation::Silu, GatedActivation::GeluTanh] {
                    let gated = Input::Gated(GatedInput { activation, gate: &y, up: &y });
                    validate_wgsl(&variant.source(quant, textures, gated, Outputs::AddTo(&y)));
                }
                for convention in [NormWeight::Scale, NormWeight::OnePlus] {
                    let normed = Input::Normed(&y, RmsNorm { weight: &y, convention, eps: 1e-6 });
                    validate_wgsl(&variant.source(quant, textures, normed, Outputs::One(&y)));
                    validate_wgsl(&variant.source(quant, textures, normed, Outputs::Split(&y, &y, None)));
                    validate_wgsl(&variant.source(quant, textures, normed, Outputs::Split(&y, &y, Some(&y))));
                }
            }
        }
    }

    /// Prints the time of the device's own variant on prefill-shaped products (SmolLM2-135M's
    /// Q4_1 576 x 1536 projection and its 49152 x 576 Q8_0 LM head). Not an assertion: run with
    /// `cargo test --release -p flint-core --lib kernels::matmul::tests::timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing print, run by hand in a release build"]
    fn timing() {
        let mut rng = Rng::new("matmul timing");
        for ((path, ctx), (quant, rows, cols)) in both_paths()
            .into_iter()
            .flat_map(|p| [(p, (QuantType::Q4_1, 1536, 576)), (p, (QuantType::Q8_0, 49152, 576))])
        {
            let bytes = random_rows(quant, rows, cols, &mut rng);
            let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes).unwrap();
            for batch in [1, 8, 64] {
                let x =
                    Tensor::from_slice(ctx, "x", &[batch, cols], &rng.f32s(batch * cols, -1.0, 1.0)).unwrap();
                let y = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
                let variant = tuning::matmul_variant(ctx, quant, rows, cols, batch);
                let run = |reps: usize| {
                    let mut encoder = ctx.encoder("timing");
                    for _ in 0..reps {
                        record(
                            ctx,
                            &mut encoder,
                            &weight,
                            Input::Plain(&x),
                            Outputs::One(&y),
                            batch,
                            variant,
                        )
                        .unwrap();
                    }
                    ctx.submit(encoder).unwrap();
                    pollster::block_on(y.to_f32(ctx)).unwrap();
                };
                run(1);
                let reps = if rows * batch > 1 << 20 { 3 } else { 20 };
                let start = std::time::Instant::now();
                run(reps);
                let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
                let gflops = 2.0 * (rows * cols * batch) as f64 / ms / 1e6;
                eprintln!(
                    "{path}: {quant} {rows}x{cols} batch {batch}: {ms:.2} ms ({gflops:.1} GFLOP/s), {variant:?}"
                );
            }
        }
    }

    /// Prints the time of gemma3's 4096 x 640 Q5_0 gate/up product with a plain, a normalised
    /// and a residual input, through the device's own tile and others (min of 3 alternating runs
    /// of 5): what [`fuses_residual_input`] is set from. Run with `cargo test --release -p
    /// flint-core --lib kernels::matmul::tests::timing_inputs -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing print, run by hand in a release build"]
    fn timing_inputs() {
        let mut rng = Rng::new("matmul timing inputs");
        let ctx = gpu();
        let (quant, rows, cols) = (QuantType::Q5_0, 4096, 640);
        let bytes = random_rows(quant, rows, cols, &mut rng);
        let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes).unwrap();
        let norms = Tensor::from_slice(ctx, "norms", &[2, cols], &rng.f32s(2 * cols, -1.0, 1.0)).unwrap();
        let norm_weight = Tensor::from_slice(ctx, "norm", &[cols], &rng.f32s(cols, -1.0, 1.0)).unwrap();
        for batch in [1, 16, 64] {
            let tensor = |rng: &mut Rng| {
                Tensor::from_slice(ctx, "x", &[batch, cols], &rng.f32s(batch * cols, -1.0, 1.0)).unwrap()
            };
            let (x, sublayer, sum) = (tensor(&mut rng), tensor(&mut rng), tensor(&mut rng));
            let y = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
            let norm = RmsNorm { weight: &norm_weight, convention: NormWeight::Scale, eps: 1e-6 };
            let residual = ResidualInput {
                residual: &x,
                sublayer: &sublayer,
                norm_weights: &norms,
                convention: NormWeight::Scale,
                eps: 1e-6,
                sum: &sum,
            };
            let inputs = [
                ("plain", Input::Plain(&x)),
                ("normed", Input::Normed(&x, norm)),
                ("residual", Input::Residual(residual)),
            ];
            // The device's own tile, then others, for each input: the best tile of one input
            // need not be another's.
            let chosen = tuning::matmul_variant(ctx, quant, rows, cols, batch);
            let tiles = [(chosen.row_tile, chosen.batch_tile), (2, 2), (2, 4), (4, 2), (4, 4), (1, 8)];
            let mut cases: Vec<(&str, Input, Variant, f64)> = Vec::new();
            for (row_tile, batch_tile) in tiles.into_iter().filter(|&(_, t)| t as usize <= batch) {
                for &(name, input) in &inputs {
                    cases.push((name, input, Variant { row_tile, batch_tile, ..chosen }, f64::MAX));
                }
            }
            for _ in 0..3 {
                for (_, input, variant, best) in &mut cases {
                    let run = |reps: usize| {
                        let mut encoder = ctx.encoder("timing");
                        for _ in 0..reps {
                            record(ctx, &mut encoder, &weight, *input, Outputs::One(&y), batch, *variant)
                                .unwrap();
                        }
                        ctx.submit(encoder).unwrap();
                        pollster::block_on(y.to_f32(ctx)).unwrap();
                    };
                    run(1);
                    let start = std::time::Instant::now();
                    run(5);
                    *best = best.min(start.elapsed().as_secs_f64() * 1e3 / 5.0);
                }
            }
            for (name, _, variant, ms) in cases {
                let (r, t) = (variant.row_tile, variant.batch_tile);
                eprintln!("{quant} {rows}x{cols} batch {batch} {name:>8}, tile {r} x {t}: {ms:.2} ms");
            }
        }
    }

    /// Times, with GPU timestamps, the matmul variants a GPU could take on SmolLM2's and gemma3's
    /// product shapes at batch sizes from decode to prefill, and prints a table (the medians of
    /// 9 dispatches): what `tuning::matmul_variant` for GPUs is set from. Needs timestamp queries. Run
    /// on the GPU with `cargo test --release -p flint-core --lib
    /// kernels::matmul::tests::timing_sweep -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing print for GPUs, run by hand in a release build"]
    fn timing_sweep() {
        let ctx = gpu();
        if !ctx.features().timestamps {
            eprintln!("{}: no timestamp queries, nothing timed", ctx.adapter_info().name);
            return;
        }
        let mut rng = Rng::new("matmul timing sweep");
        let shapes = [
            (QuantType::Q4_1, 1536, 576),
            (QuantType::Q4_1, 576, 1536),
            (QuantType::Q4K, 640, 2048),
            (QuantType::Q8_0, 49152, 576),
        ];
        eprintln!("{}: median of 9 dispatches, GPU timestamps", ctx.adapter_info().name);
        for (quant, rows, cols) in shapes {
            let bytes = random_rows(quant, rows, cols, &mut rng);
            let weight = QuantMatrix::upload(ctx, "w", quant, rows, cols, &bytes).unwrap();
            for batch in [1, 4, 8, 16, 32, 64, 128, 256] {
                let x =
                    Tensor::from_slice(ctx, "x", &[batch, cols], &rng.f32s(batch * cols, -1.0, 1.0)).unwrap();
                let y = Tensor::empty(ctx, "y", &[batch, rows]).unwrap();
                let mut variants = vec![TILED];
                for threads_per_row in [8, 32] {
                    for row_tile in [1, 2, 4] {
                        for batch_tile in
                            [1u32, 4, 8, 16].into_iter().filter(|&t| t as usize <= batch.next_power_of_two())
                        {
                            variants.push(Variant {
                                wg_size: 128,
                                threads_per_row,
                                row_tile,
                                batch_tile,
                                reduce: Reduce::Subgroup,
                                x_broadcast: false,
                                x_window_rows: None,
                                tiled: false,
                            });
                        }
                    }
                }
                let chosen = tuning::matmul_variant(ctx, quant, rows, cols, batch);
                let mut times: Vec<(f64, Variant)> = Vec::new();
                for variant in variants {
                    let record_times = |times: usize| -> Result<()> {
                        let mut encoder = ctx.encoder("timing");
                        for _ in 0..times {
                            let (input, outputs) = (Input::Plain(&x), Outputs::One(&y));
                            record(ctx, &mut encoder, &weight, input, outputs, batch, variant)?;
                        }
                        ctx.submit(encoder)
                    };
                    let time = || -> Result<f64> {
                        record_times(1)?;
                        ctx.start_profile(9)?;
                        record_times(9)?;
                        let mut seconds: Vec<f64> =
                            pollster::block_on(ctx.finish_profile())?.iter().map(|t| t.seconds).collect();
                        seconds.sort_by(f64::total_cmp);
                        Ok(seconds[seconds.len() / 2])
                    };
                    match time() {
                        Ok(seconds) => times.push((seconds, variant)),
                        Err(e) => eprintln!("  {variant:?}: {e}"),
                    }
                }
                times.sort_by(|a, b| a.0.total_cmp(&b.0));
                let describe = |(seconds, v): &(f64, Variant)| {
                    let gflops = 2.0 * (rows * cols * batch) as f64 / seconds / 1e9;
                    let shape = if v.tiled {
                        "tiled 64x64".to_string()
                    } else {
                        format!("tpr {} rows {} batch {}", v.threads_per_row, v.row_tile, v.batch_tile)
                    };
                    format!("{:.1} us {shape} ({gflops:.0} GFLOP/s)", seconds * 1e6)
                };
                let chosen_time = times.iter().find(|(_, v)| *v == chosen).map(describe);
                let best: Vec<String> = times.iter().take(3).map(describe).collect();
                eprintln!(
                    "{quant} {rows}x{cols} batch {batch}: best {}; chosen {}",
                    best.join(", "),
                    chosen_time.unwrap_or_else(|| format!("{chosen:?}, not in the sweep"))
                );
            }
        }
    }
}
