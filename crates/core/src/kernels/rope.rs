//! Rotary position embedding (`shaders/rope.wgsl`), in place on `[tokens, heads, head_dim]`.
//!
//! A [`Rope`] is built once per model (or per kind of layer: Gemma 3 has two bases) from its
//! [`RopeConfig`]; it holds each rotated pair's frequency, computed in f64 on the CPU and
//! uploaded as a fixed-point fraction of a turn per position. The rotation matches llama.cpp's:
//! pair `i` of `n_rot / 2` turns by `theta_i = pos * freq_scale * base^(-2i / n_rot) /
//! freq_factor_i`, with `x0' = x0 cos - x1 sin` and `x1' = x0 sin + x1 cos`.
//!
//! ```no_run
//! # async fn example(ctx: &flint_core::gpu::GpuContext) -> flint_core::Result<()> {
//! use flint_core::gpu::Tensor;
//! use flint_core::kernels::rope::{Rope, RopeConfig, RopeLayout, rope};
//!
//! let config = RopeConfig {
//!     head_dim: 64,
//!     rotated_dims: 64,
//!     base: 10000.0,
//!     freq_scale: 1.0,
//!     layout: RopeLayout::Interleaved,
//!     freq_factors: None,
//! };
//! let rotary = Rope::new(ctx, &config)?;
//! let (tokens, heads) = (2, 9);
//! let q = Tensor::from_slice(ctx, "q", &[tokens, heads * 64], &vec![1.0f32; tokens * heads * 64])?;
//! let positions = Tensor::from_slice(ctx, "positions", &[tokens], &[7u32, 8])?;
//! let mut encoder = ctx.encoder("layer 0");
//! rope(ctx, &mut encoder, &rotary, &q, &positions)?;
//! ctx.submit(encoder)?;
//! # Ok(())
//! # }
//! ```

use std::f64::consts::TAU;

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, Tensor};
use crate::kernels::ensure;

const COMMON: &str = include_str!("../../shaders/rope_common.wgsl");
const SOURCE: &str = include_str!("../../shaders/rope.wgsl");
const WG_SIZE: u32 = 64;

/// Which dimensions of a head rotate together (llama.cpp's rope types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// llama.cpp's "normal" rope: pairs `(2i, 2i + 1)`. Llama-architecture GGUFs use it (their
    /// converter permutes the q and k weights to fit).
    Interleaved,
    /// GPT-NeoX rope: pairs `(i, i + n_rot / 2)`. Gemma, Qwen, Phi, GPT-NeoX ...
    NeoX,
}

/// The rotary embedding of one model's attention heads, as its GGUF metadata gives it.
#[derive(Clone, Copy, Debug)]
pub struct RopeConfig<'a> {
    /// Elements per head.
    pub head_dim: usize,
    /// Leading dims of each head that rotate (`n_rot`, `{arch}.rope.dimension_count`): even, at
    /// most `head_dim`; the dims after them pass through unchanged.
    pub rotated_dims: usize,
    /// Frequency base (`{arch}.rope.freq_base`), e.g. 10000 or 1e6.
    pub base: f32,
    /// Linear position scaling: the angle uses `pos * freq_scale` (1 for none; the GGUF key
    /// `{arch}.rope.scaling.factor` is its inverse).
    pub freq_scale: f32,
    /// Which dimensions pair up.
    pub layout: RopeLayout,
    /// Per-pair frequency divisors (the `rope_freqs.weight` tensor of Llama 3.1+ GGUFs), one per
    /// rotated pair.
    pub freq_factors: Option<&'a [f32]>,
}

/// A [`RopeConfig`] ready for the GPU: its per-pair frequencies uploaded once.
pub struct Rope {
    head_dim: u32,
    rot_pairs: u32,
    layout: RopeLayout,
    /// Per pair, `theta_i / (2π pos)` as a 0.32 fixed-point fraction of a turn (see
    /// rope_common.wgsl).
    turns: Tensor,
    /// The same, on the CPU: decode attention keeps a copy among its constants.
    turn_values: Vec<u32>,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    pairs: u32,
    heads: u32,
    _pad: [u32; 2],
}

impl Rope {
    /// The length of the heads this rope rotates.
    pub fn head_dim(&self) -> usize {
        self.head_dim as usize
    }

    /// Each rotated pair's fraction of a turn per position (see rope_common.wgsl).
    pub(crate) fn turns(&self) -> &Tensor {
        &self.turns
    }

    /// [`Rope::turns`] on the CPU.
    pub(crate) fn turn_values(&self) -> &[u32] {
        &self.turn_values
    }

    /// Rotated pairs per head.
    pub(crate) fn rot_pairs(&self) -> usize {
        self.rot_pairs as usize
    }

    /// Checks `config` and uploads its frequencies.
    pub fn new(ctx: &GpuContext, config: &RopeConfig<'_>) -> Result<Self> {
        let RopeConfig { head_dim, rotated_dims, base, freq_scale, layout, freq_factors } = *config;
        ensure(
            "rope",
            rotated_dims >= 2 && rotated_dims.is_multiple_of(2) && rotated_dims <= head_dim,
            || {
                format!(
                    "rotated_dims is {rotated_dims}; it must be even, at least 2 and at most head_dim ({head_dim})"
                )
            },
        )?;
        ensure("rope", head_dim <= u32::MAX as usize, || format!("head_dim {head_dim} is too large"))?;
        ensure("rope", base.is_finite() && base > 0.0 && freq_scale.is_finite() && freq_scale > 0.0, || {
            format!("base is {base} and freq_scale {freq_scale}; both must be finite and positive")
        })?;
        let pairs = rotated_dims / 2;
        if let Some(factors) = freq_factors {
            ensure("rope", factors.len() == pairs, || {
                format!("{} freq_factors given; there must be one per rotated pair ({pairs})", factors.len())
            })?;
            ensure("rope", factors.iter().all(|f| f.is_finite() && *f > 0.0), || {
                "freq_factors must all be finite and positive".to_string()
            })?;
        }
        let turns: Vec<u32> = (0..pairs)
            .map(|i| {
                let factor = freq_factors.map_or(1.0, |f| f64::from(f[i]));
                let exponent = -2.0 * i as f64 / rotated_dims as f64;
                let turns_per_position =
                    f64::from(freq_scale) * f64::from(base).powf(exponent) / factor / TAU;
                // Whole turns per position do not change the angle of an integer position.
                let fraction = turns_per_position - turns_per_position.floor();
                ((fraction * 2f64.powi(32)).round() as u64 & u64::from(u32::MAX)) as u32
            })
            .collect();
        Ok(Rope {
            head_dim: head_dim as u32,
            rot_pairs: pairs as u32,
            layout,
            turns: Tensor::from_slice(ctx, "rope turns per position", &[pairs], &turns)?,
            turn_values: turns,
        })
    }

    fn source(&self) -> KernelSource {
        self.kernel("rope", &[SOURCE]).define("WG_SIZE", format!("{WG_SIZE}u"))
    }

    /// A kernel that rotates as this does: `parts` composed after the shared rotation, with
    /// this rope's constants defined.
    pub(crate) fn kernel(&self, entry: &'static str, parts: &[&'static str]) -> KernelSource {
        KernelSource::new(entry, &[&[COMMON], parts].concat())
            .define("HEAD_DIM", format!("{}u", self.head_dim))
            .define("ROT_PAIRS", format!("{}u", self.rot_pairs))
            .define("NEOX", self.layout == RopeLayout::NeoX)
    }
}

/// Records the rotation of `x` in place: `x` is `[tokens, heads, head_dim]` or
/// `[tokens, heads * head_dim]`, `positions` holds one u32 position per token.
pub fn rope(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    rope: &Rope,
    x: &Tensor,
    positions: &Tensor,
) -> Result<()> {
    let tokens = positions.len();
    let head_dim = rope.head_dim as usize;
    let row_len = x.shape().last().copied();
    ensure(
        "rope",
        x.shape().first() == Some(&tokens)
            && x.shape().len() >= 2
            && row_len.is_some_and(|n| n.is_multiple_of(head_dim)),
        || {
            format!(
                "x has shape {:?} and positions {tokens} elements; x must be [tokens, heads, {head_dim}] \
                 or [tokens, heads * {head_dim}] with one position per token",
                x.shape()
            )
        },
    )?;
    ensure("rope", positions.buffer() != x.buffer(), || "positions must not be x".to_string())?;
    if x.is_empty() {
        return Ok(());
    }
    let rows = x.len() / head_dim;
    let heads = rows / tokens;
    let pairs = rows as u64 * u64::from(rope.rot_pairs);
    ensure("rope", pairs < u64::from(u32::MAX), || {
        format!("{pairs} rotated pairs are too many for one dispatch")
    })?;
    let pairs = pairs as u32;
    let params = encoder.params(ctx, &Params { pairs, heads: heads as u32, _pad: [0; 2] })?;
    ctx.dispatch(
        encoder,
        &rope.source(),
        &[params.binding(), rope.turns.binding(), positions.binding(), x.binding()],
        ctx.grid(pairs.div_ceil(WG_SIZE)),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::testing::{Rng, assert_close, gpu, validate_wgsl};

    /// The angle's fixed-point frequency is off by at most 2^-33 turns per position unit, and the
    /// signed turn becomes an f32 angle within 2^-24 relative; sin and cos of an angle in
    /// [-π, π) are a few ULP off on lavapipe. Relative to the row's scale, an output is off by at
    /// most a few times the angle's error.
    pub(crate) fn tolerance(max_position: u32) -> f32 {
        let angle_error = f64::from(max_position) * TAU * 2f64.powi(-33) + 4e-7;
        (4.0 * angle_error + 1e-6) as f32
    }

    pub(crate) fn reference(x: &[f32], positions: &[u32], config: &RopeConfig<'_>) -> Vec<f32> {
        let mut out = x.to_vec();
        let n_rot = config.rotated_dims;
        let pairs = n_rot / 2;
        let tokens = positions.len();
        let rows = x.len() / config.head_dim;
        for (r, head) in out.chunks_mut(config.head_dim).enumerate() {
            let position = f64::from(positions[r / (rows / tokens)]);
            for i in 0..pairs {
                let factor = config.freq_factors.map_or(1.0, |f| f64::from(f[i]));
                let theta = position
                    * f64::from(config.freq_scale)
                    * f64::from(config.base).powf(-2.0 * i as f64 / n_rot as f64)
                    / factor;
                let (a, b) = match config.layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::NeoX => (i, i + pairs),
                };
                let (x0, x1) = (f64::from(head[a]), f64::from(head[b]));
                head[a] = (x0 * theta.cos() - x1 * theta.sin()) as f32;
                head[b] = (x0 * theta.sin() + x1 * theta.cos()) as f32;
            }
        }
        out
    }

    /// Rotates `x` (shape `[tokens, heads, head_dim]`) on the GPU and returns it.
    fn run(
        ctx: &GpuContext,
        config: &RopeConfig<'_>,
        x: &[f32],
        heads: usize,
        positions: &[u32],
    ) -> Vec<f32> {
        let rope_gpu = Rope::new(ctx, config).unwrap();
        let shape = [positions.len(), heads, config.head_dim];
        let x_gpu = Tensor::from_slice(ctx, "x", &shape, x).unwrap();
        let positions_gpu = Tensor::from_slice(ctx, "positions", &[positions.len()], positions).unwrap();
        let mut encoder = ctx.encoder("test");
        rope(ctx, &mut encoder, &rope_gpu, &x_gpu, &positions_gpu).unwrap();
        ctx.submit(encoder).unwrap();
        pollster::block_on(x_gpu.to_f32(ctx)).unwrap()
    }

    pub(crate) fn config(head_dim: usize, rotated_dims: usize, layout: RopeLayout) -> RopeConfig<'static> {
        RopeConfig { head_dim, rotated_dims, base: 10000.0, freq_scale: 1.0, layout, freq_factors: None }
    }

    #[test]
    fn both_layouts_validate() {
        for layout in [RopeLayout::Interleaved, RopeLayout::NeoX] {
            for (head_dim, rotated_dims) in [(64, 64), (80, 32), (256, 256), (2, 2)] {
                validate_wgsl(&Rope::new(gpu(), &config(head_dim, rotated_dims, layout)).unwrap().source());
            }
        }
    }

    #[test]
    fn full_and_partial_rotation_match_the_reference() {
        let ctx = gpu();
        let mut rng = Rng::new("rope shapes");
        for layout in [RopeLayout::Interleaved, RopeLayout::NeoX] {
            for (head_dim, rotated_dims) in [(64, 64), (80, 80), (80, 32), (128, 64), (256, 256), (6, 2)] {
                for (tokens, heads) in [(1, 1), (3, 7), (17, 3)] {
                    let x = rng.f32s(tokens * heads * head_dim, -2.0, 2.0);
                    let positions: Vec<u32> = (0..tokens).map(|_| rng.u32() % 4096).collect();
                    let config = RopeConfig { base: 1e6, ..config(head_dim, rotated_dims, layout) };
                    let got = run(ctx, &config, &x, heads, &positions);
                    let expected = reference(&x, &positions, &config);
                    let what = format!(
                        "rope {layout:?} head_dim {head_dim} n_rot {rotated_dims} tokens {tokens} heads {heads}"
                    );
                    assert_close(&what, &got, &expected, tolerance(4096));
                    // The pass-through dims must be untouched, bit for bit.
                    for (row_got, row_x) in got.chunks(head_dim).zip(x.chunks(head_dim)) {
                        assert_eq!(
                            row_got[rotated_dims..],
                            row_x[rotated_dims..],
                            "{what}: pass-through dims"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn large_positions_scaling_and_freq_factors_match_the_reference() {
        let ctx = gpu();
        let mut rng = Rng::new("rope positions");
        let (tokens, heads, head_dim) = (9, 2, 128);
        let factors = rng.f32s(head_dim / 2, 1.0, 8.0);
        let mut positions: Vec<u32> = (0..tokens).map(|_| 29_000 + rng.u32() % 1001).collect();
        positions[0] = 0;
        for layout in [RopeLayout::Interleaved, RopeLayout::NeoX] {
            for (freq_scale, freq_factors) in [(1.0, None), (0.25, None), (1.0, Some(factors.as_slice()))] {
                let config = RopeConfig { freq_scale, freq_factors, ..config(head_dim, head_dim, layout) };
                let x = rng.f32s(tokens * heads * head_dim, -1.0, 1.0);
                let got = run(ctx, &config, &x, heads, &positions);
                let what = format!(
                    "rope {layout:?} positions to 30000, scale {freq_scale}, factors {}",
                    freq_factors.is_some()
                );
                assert_close(&what, &got, &reference(&x, &positions, &config), tolerance(30_000));
            }
        }
    }

    #[test]
    fn more_pairs_than_one_grid_dimension_holds() {
        let ctx = gpu();
        let mut rng = Rng::new("rope many pairs");
        // 4111 * 16 * 64 pairs need more than 65535 workgroups of 64.
        let (tokens, heads, head_dim) = (4111, 16, 128);
        let x = rng.f32s(tokens * heads * head_dim, -1.0, 1.0);
        let positions: Vec<u32> = (0..tokens as u32).collect();
        let config = config(head_dim, head_dim, RopeLayout::NeoX);
        let got = run(ctx, &config, &x, heads, &positions);
        assert_close("rope 4.2M pairs", &got, &reference(&x, &positions, &config), tolerance(tokens as u32));
    }

    #[test]
    fn bad_configs_and_shapes_are_errors() {
        let ctx = gpu();
        let odd = Rope::new(ctx, &config(64, 63, RopeLayout::NeoX)).map(|_| ()).unwrap_err();
        assert!(odd.to_string().contains("even"), "{odd}");
        let wide = Rope::new(ctx, &config(64, 66, RopeLayout::NeoX)).map(|_| ()).unwrap_err();
        assert!(wide.to_string().contains("at most head_dim"), "{wide}");
        let factors = [1.0f32; 3];
        let short = RopeConfig { freq_factors: Some(&factors), ..config(64, 64, RopeLayout::NeoX) };
        let err = Rope::new(ctx, &short).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("one per rotated pair"), "{err}");

        let rope_64 = Rope::new(ctx, &config(64, 64, RopeLayout::Interleaved)).unwrap();
        let positions = Tensor::empty(ctx, "positions", &[3]).unwrap();
        let mut encoder = ctx.encoder("test");
        for shape in [&[4usize, 2, 64][..], &[3, 96], &[3 * 64]] {
            let x = Tensor::empty(ctx, "x", shape).unwrap();
            let err = rope(ctx, &mut encoder, &rope_64, &x, &positions).unwrap_err();
            assert!(err.to_string().contains("one position per token"), "{shape:?}: {err}");
        }
    }
}
