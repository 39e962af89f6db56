//! Quantized matrix × vector and matrix × matrix (`shaders/matmul.wgsl`): `y = x · Wᵀ` with W
//! a [`QuantMatrix`] in any [`QuantType`], decoded inside the kernel by the type's block
//! decoder from `shaders/quant/`; f32 activations, f32 sums.
//!
//! One entry point, [`matmul`]: a [`MatmulInput`] says how the kernel reads x (as it is,
//! normalised, gated, or joined with a residual stream) and a [`MatmulOutput`] where the rows
//! go (written, added, or split among a stacked weight's parts). The device's variant comes
//! from `tuning::matmul_variant`.

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, QuantMatrix, Tensor, UNIFORM_WINDOW_BYTES};
use crate::kernels::elementwise::{ACTIVATION_SOURCE, GatedActivation};
use crate::kernels::ensure;
use crate::kernels::norm::{NormWeight, RmsNorm};
use crate::quant::QuantType;
use crate::tuning;

const SOURCE: &str = include_str!("../../../shaders/matmul.wgsl");

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Reduce {
    /// One invocation per row: nothing to add.
    None,
    /// `subgroupShuffleXor` butterflies (the row's invocations lie in one subgroup).
    Subgroup,
    /// A tree in workgroup memory, with barriers.
    Shared,
}

/// One compiled shape of the kernel; `tuning::matmul_variant` picks the device's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
}

/// Everything a product's kernel source depends on: equal recipes, equal sources. The product
/// looks its pipeline up by this ([`GpuContext::pipeline_by_recipe`]), without building the
/// source's ~25 defines each dispatch.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Recipe {
    variant: Variant,
    quant: QuantType,
    textures: bool,
    cols: u32,
    gate: Option<GatedActivation>,
    norm: Option<NormWeight>,
    residual: bool,
    /// Output tensors: 1, or a split's 2 or 3.
    outputs: usize,
    split: bool,
    add: bool,
}

impl Recipe {
    fn of(
        variant: Variant,
        quant: QuantType,
        textures: bool,
        input: MatmulInput,
        outputs: MatmulOutput,
    ) -> Self {
        let (gate, norm) = match input {
            MatmulInput::Plain(_) => (None, None),
            MatmulInput::Gated(gated) => (Some(gated.activation), None),
            MatmulInput::Normed(_, norm) => (None, Some(norm.convention)),
            MatmulInput::Residual(residual) => (None, Some(residual.convention)),
        };
        Recipe {
            variant,
            quant,
            textures,
            cols: input.x().shape().last().copied().unwrap_or(0) as u32,
            gate,
            norm,
            residual: matches!(input, MatmulInput::Residual(_)),
            outputs: outputs.tensors().len(),
            split: matches!(outputs, MatmulOutput::Split(_)),
            add: matches!(outputs, MatmulOutput::AddTo(_)),
        }
    }

    fn source(&self) -> KernelSource {
        let Recipe { variant, quant, textures, cols, gate, norm, residual, outputs, split, add } = *self;
        let family: &[&'static str] = if gate.is_some() { &[ACTIVATION_SOURCE, SOURCE] } else { &[SOURCE] };
        QuantMatrix::kernel_source(quant, textures, "matmul", family)
            .define("NORMED", norm.is_some())
            .define("NORM_ONE_PLUS", norm == Some(NormWeight::OnePlus))
            .define("RESIDUAL", residual)
            // After y, params (3) and the other outputs.
            .define("NORM_BINDING", format!("{}u", 3 + outputs))
            .define("NORM_VEC4S", format!("{}u", cols / 4 * if residual { 2 } else { 1 }))
            .define("GATED", gate.is_some())
            .define("GATE_SILU", gate == Some(GatedActivation::Silu))
            .define("GATE_GELU", gate == Some(GatedActivation::GeluTanh))
            .define("SPLIT", split)
            .define("THIRD", split && outputs == 3)
            .define("ADD_TO_OUTPUT", add)
            .define("WG_SIZE", format!("{}u", variant.wg_size))
            .define("THREADS_PER_ROW", format!("{}u", variant.threads_per_row))
            .define("ROW_TILE", format!("{}u", variant.row_tile))
            .define("BATCH_TILE", format!("{}u", variant.batch_tile))
            .define("SUBGROUP_REDUCE", variant.reduce == Reduce::Subgroup)
            .define("SHARED_REDUCE", variant.reduce == Reduce::Shared)
            .define("TILED", variant.tiled)
            .define("X_BROADCAST", variant.x_broadcast)
            .define("X_UNIFORM", variant.x_window_rows.is_some())
            .define("X_WINDOW_VEC4S", format!("{}u", variant.x_window_rows.unwrap_or(0) * cols / 4))
            .define("WIDE", variant.threads_per_row == 1)
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
pub enum MatmulInput<'a> {
    /// x as it is, `[batch, cols]`.
    Plain(&'a Tensor),
    /// x RMS-normalised by the norm, row by row, as the kernel loads it: the norm's pass over
    /// memory and its dispatch are saved.
    Normed(&'a Tensor, RmsNorm<'a>),
    /// `activation(gate) * up`: a feed-forward layer's down projection with its gated
    /// activation computed in the same pass.
    Gated(GatedInput<'a>),
    /// `norm(residual + post_norm(sublayer))`, the sum stored for the layers after (see
    /// [`ResidualInput`]).
    Residual(ResidualInput<'a>),
}

impl<'a> MatmulInput<'a> {
    /// The tensor whose shape is the activations', bound as `x`.
    fn x(self) -> &'a Tensor {
        match self {
            MatmulInput::Plain(x) | MatmulInput::Normed(x, _) => x,
            MatmulInput::Gated(gated) => gated.gate,
            MatmulInput::Residual(residual) => residual.residual,
        }
    }

    /// The tensors read through uniform windows where the variant has them: x, and a gated
    /// input's up projection or a residual input's sublayer.
    fn windowed(self) -> Vec<&'a Tensor> {
        match self {
            MatmulInput::Plain(x) | MatmulInput::Normed(x, _) => vec![x],
            MatmulInput::Gated(gated) => vec![gated.gate, gated.up],
            MatmulInput::Residual(residual) => vec![residual.residual, residual.sublayer],
        }
    }

    fn eps(self) -> f32 {
        match self {
            MatmulInput::Normed(_, norm) => norm.eps,
            MatmulInput::Residual(residual) => residual.eps,
            MatmulInput::Plain(_) | MatmulInput::Gated(_) => 0.0,
        }
    }
}

/// Where the rows of a product go: `[batch, rows]` tensors with x's batch rows.
#[derive(Clone, Copy)]
pub enum MatmulOutput<'a> {
    /// Every row to one tensor, overwriting it.
    Write(&'a Tensor),
    /// Every row added to what one tensor holds, as a residual connection does.
    AddTo(&'a Tensor),
    /// The rows of each part of a weight stacked from two or three matrices
    /// ([`QuantMatrix::upload_stacked`]) to their own tensor, in order, each `[batch, that
    /// part's rows]`: one pass computes several projections of the same input.
    Split(&'a [&'a Tensor]),
}

impl<'a> MatmulOutput<'a> {
    fn tensors(&self) -> &[&'a Tensor] {
        match self {
            MatmulOutput::Write(y) | MatmulOutput::AddTo(y) => std::slice::from_ref(y),
            MatmulOutput::Split(parts) => parts,
        }
    }
}

/// Records `y[b, r] = Σ_k weight[r, k] · x[b, k]` for every batch row b of `input` (all leading
/// dimensions together), x as `input` describes it, into `output`. Batch 1 is a matrix ×
/// vector product; larger batches (prefill, batched decode) reuse each decoded weight for up
/// to 16 batch rows (64 in GPUs' tiled kernel). One dispatch per chunk of the weight (and per
/// uniform window of x where the device reads x so).
pub fn matmul(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: MatmulInput<'_>,
    output: MatmulOutput<'_>,
) -> Result<()> {
    run(ctx, encoder, weight, input, output, None)
}

/// Checks the arguments and records the product through `variant`, or the device's choice.
fn run(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    weight: &QuantMatrix,
    input: MatmulInput,
    outputs: MatmulOutput,
    variant: Option<Variant>,
) -> Result<()> {
    let batch = batch_rows(weight, input, outputs)?;
    let variant = variant
        .unwrap_or_else(|| tuning::matmul_variant(ctx, weight.quant(), weight.rows(), weight.cols(), batch));
    record(ctx, encoder, weight, input, outputs, batch, variant)
}

/// Checks that x and the outputs fit the weight; returns the number of batch rows.
fn batch_rows(weight: &QuantMatrix, input: MatmulInput, outputs: MatmulOutput) -> Result<usize> {
    let (rows, cols) = (weight.rows(), weight.cols());
    let x = input.x();
    if let MatmulInput::Gated(gated) = input {
        ensure("matmul", gated.up.shape() == gated.gate.shape(), || {
            format!("gate {:?} and up {:?} must have the same shape", gated.gate.shape(), gated.up.shape())
        })?;
    }
    if let MatmulInput::Normed(_, norm) = input {
        ensure("matmul", norm.weight.shape() == [cols], || {
            format!(
                "the norm's weight is {:?}, but weight '{}' has {cols} columns",
                norm.weight.shape(),
                weight.name()
            )
        })?;
    }
    if let MatmulInput::Residual(residual) = input {
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
    if let MatmulOutput::Split(parts) = outputs {
        ensure("matmul", (2..=3).contains(&parts.len()), || {
            format!("a split product has 2 or 3 outputs, not {}", parts.len())
        })?;
    }
    let batch = x.len() / cols;
    let tensors = outputs.tensors();
    let widths: Vec<usize> = match outputs {
        MatmulOutput::Split(..) => weight.part_rows().to_vec(),
        MatmulOutput::Write(_) | MatmulOutput::AddTo(_) => vec![rows],
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
    input: MatmulInput,
    outputs: MatmulOutput,
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
    let recipe = Recipe::of(variant, weight.quant(), weight.in_textures(), input, outputs);
    let kernel = ctx.pipeline_by_recipe(recipe, || recipe.source())?;
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
                MatmulInput::Gated(gated) => bindings.push(x_binding(gated.up, x_offset, window_bytes)),
                MatmulInput::Normed(_, norm) => bindings.push(norm.weight.binding()),
                MatmulInput::Residual(residual) => bindings.extend([
                    residual.norm_weights.binding(),
                    x_binding(residual.sublayer, x_offset, window_bytes),
                    residual.sum.binding(),
                ]),
                MatmulInput::Plain(_) => {}
            }
            let groups = [gx, gy, rows_here.div_ceil(variant.batch_tile as usize) as u32];
            ctx.dispatch_compiled(encoder, &kernel, &bindings, groups)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(feature = "kernel-timing")]
#[doc(hidden)]
pub mod timing;
