//! Attention over a paged KV cache (`shaders/attention*.wgsl`, `shaders/kv_store.wgsl`,
//! `shaders/rope_kv.wgsl`, the cache's words in `shaders/kv_halves.wgsl`): storing the keys and values of new tokens, decode attention (one new
//! token per sequence) and causal prefill attention (many rows, several sequences, chunks after
//! cached tokens).
//!
//! The cache of one layer ([`KvCacheLayer`]) is two f16 tensors K and V, each
//! `[num_blocks, block_size, n_kv_heads, head_dim]`, held as u32 words of two halves. A sequence owns blocks listed in order in its
//! row of a block table (u32 `[n_seqs, max_blocks_per_seq]`): its token at position `j` lives in
//! slot `table[j / block_size] * block_size + j % block_size`. New tokens' query and key heads
//! are normalised (where the model does) and rotated by the layer's [`HeadTransform`]. A prefill
//! step does that and writes the new keys and values with [`HeadTransform::apply_and_store`],
//! then runs [`prefill`], which reads every key, cached or new, from the cache. A decode step is
//! one pass: [`decode`] transforms the new token's heads itself, stores its key and value, and
//! attends to the cached keys and the new one. Query head `h` reads kv head
//! `h / (n_heads / n_kv_heads)` (grouped-query attention). The softmax is computed online
//! (running maximum and sum), so the context length is limited only by the block table, not by
//! workgroup memory.
//!
//! ```no_run
//! # async fn step() -> flint_core::Result<()> {
//! use flint_core::gpu::{GpuContext, GpuOptions, Tensor};
//! use flint_core::kernels::attention::{
//!     self, AttentionOptions, DecodeBatch, HeadTransform, KvCacheLayer, Projections,
//! };
//! use flint_core::kernels::rope::{RopeConfig, RopeLayout};
//!
//! let ctx = GpuContext::new(&GpuOptions::default()).await?;
//! let rope = RopeConfig {
//!     head_dim: 64,
//!     rotated_dims: 64,
//!     base: 10000.0,
//!     freq_scale: 1.0,
//!     layout: RopeLayout::Interleaved,
//!     freq_factors: None,
//! };
//! let heads = HeadTransform::new(&ctx, &rope, None)?;
//! // 4 blocks of 16 tokens, 2 kv heads of 64 f16 (32 words); one sequence whose third token
//! // (position 2) is new, in blocks 2 and 0.
//! let (k, v) = (Tensor::empty(&ctx, "k", &[4, 16, 2, 32])?, Tensor::empty(&ctx, "v", &[4, 16, 2, 32])?);
//! let cache = KvCacheLayer::new(&k, &v);
//! let block_table = Tensor::from_slice(&ctx, "table", &[1, 2], &[2u32, 0])?;
//! let context_lens = Tensor::from_slice(&ctx, "lens", &[1], &[3u32])?;
//! let q = Tensor::from_slice(&ctx, "q", &[1, 8 * 64], &[0.1f32; 512])?; // 8 query heads
//! let k_new = Tensor::from_slice(&ctx, "k_new", &[1, 2 * 64], &[0.5f32; 128])?;
//! let v_new = Tensor::from_slice(&ctx, "v_new", &[1, 2 * 64], &[1.0f32; 128])?;
//! let out = Tensor::empty(&ctx, "out", &[1, 8 * 64])?;
//!
//! let mut encoder = ctx.encoder("decode step");
//! let new = Projections { q: &q, k: &k_new, v: &v_new };
//! let batch = DecodeBatch { context_lens: &context_lens, block_table: &block_table };
//! attention::decode(&ctx, &mut encoder, &heads, &new, &cache, &batch, &AttentionOptions::new(64), &out)?;
//! ctx.submit(encoder)?;
//! # Ok(()) }
//! ```

use crate::Result;
use crate::gpu::weight::{TEXTURE_WIDTH, record_copy_to_texture};
use crate::gpu::{Encoder, GpuContext, KernelSource, Tensor};
use crate::kernels::ensure;
use crate::kernels::norm::{NormWeight, RmsNorm, rms_norm_in_place};
use crate::kernels::rope::{Rope, RopeConfig};
use crate::tuning;

/// The cache's word format, before every kernel that reads or writes the cache.
const KV_HALVES: &str = include_str!("../../../shaders/kv_halves.wgsl");
const COMMON: &str = include_str!("../../../shaders/attention.wgsl");
/// The serial kernels' shared helpers (CPU devices).
const SERIAL: &str = include_str!("../../../shaders/attention_serial.wgsl");
const DECODE: &str = include_str!("../../../shaders/attention_decode.wgsl");
const DECODE_GPU: &str = include_str!("../../../shaders/attention_decode_gpu.wgsl");
const DECODE_SERIAL: &str = include_str!("../../../shaders/attention_decode_serial.wgsl");
const COMBINE: &str = include_str!("../../../shaders/attention_combine.wgsl");
const PREFILL: &str = include_str!("../../../shaders/attention_prefill.wgsl");
const PREFILL_GPU: &str = include_str!("../../../shaders/attention_prefill_gpu.wgsl");
const PREFILL_SERIAL: &str = include_str!("../../../shaders/attention_prefill_serial.wgsl");
const KV_STORE: &str = include_str!("../../../shaders/kv_store.wgsl");
const ROPE_KV: &str = include_str!("../../../shaders/rope_kv.wgsl");

/// The largest head size the kernels take: decode spreads a head over its 64 invocations, one
/// vec4 each, and prefill's K/V tiles must fit 16 KiB of workgroup memory.
pub const MAX_HEAD_DIM: usize = 256;

const KV_STORE_WG: u32 = 256;
const ROPE_KV_WG: u32 = 64;
pub(crate) const DECODE_WG: u32 = 64;
/// One SIMD group of lavapipe (8 f32 lanes of 256 bits): the serial decode's lanes, which must
/// lie in one subgroup.
pub(crate) const DECODE_SERIAL_WG: u32 = 8;
/// Decode: the most query heads of one kv head that a workgroup serves, reading each key and
/// value once for all of them; bounded by their queries' and scores' workgroup memory.
const DECODE_MAX_GROUP_HEADS: usize = 8;
/// Prefill: query rows per workgroup and invocations per row (which split the head's vec4s).
const PREFILL_ROWS: u32 = 16;
const PREFILL_LANES: u32 = 4;
/// WebGPU's default (and minimum) workgroup memory, which every kernel stays within.
const WORKGROUP_BYTES: usize = 16384;

/// One layer's paged KV cache: K and V, each f16 `[num_blocks, block_size, n_kv_heads,
/// head_dim]` held as a u32 tensor `[num_blocks, block_size, n_kv_heads, head_dim / 2]` (each
/// word two halves, the lower dim in its low 16 bits, as WGSL's `pack2x16float` packs them;
/// [`pack_halves`] and [`unpack_halves`] do it on the CPU), in one storage binding, so each is at
/// most [`GpuContext::max_binding_bytes`] (128 MiB on lavapipe).
#[derive(Clone, Copy)]
pub struct KvCacheLayer<'a> {
    /// Keys.
    pub k: &'a Tensor,
    /// Values, the same shape as the keys.
    pub v: &'a Tensor,
    /// Blocks `0 .. blocks_in_use` include every block that the tables of a batch run against
    /// this layer list: a kernel that copies the cache before reading it copies only those.
    pub blocks_in_use: usize,
}

impl<'a> KvCacheLayer<'a> {
    /// K and V with every block in use.
    pub fn new(k: &'a Tensor, v: &'a Tensor) -> Self {
        KvCacheLayer { k, v, blocks_in_use: k.shape().first().copied().unwrap_or(0) }
    }
}

/// How scores are formed and masked, shared by [`decode`] and [`prefill`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionOptions {
    /// Multiplies `q · k` (usually `1 / sqrt(head_dim)`); finite.
    pub scale: f32,
    /// Sliding window `W` in tokens: the key at position `j` is visible from query position `p`
    /// iff `j <= p` and `p - j < W` (llama.cpp's rule). `None` sees every earlier key.
    pub sliding_window: Option<u32>,
    /// Logit soft-cap `c`: `logit = c * tanh(logit / c)`, applied after the scale and before the
    /// mask and softmax (Gemma 2). `None` leaves logits as they are; `c` is finite and positive.
    pub softcap: Option<f32>,
}

impl AttentionOptions {
    /// Plain causal attention with scale `1 / sqrt(head_dim)`.
    pub fn new(head_dim: usize) -> Self {
        AttentionOptions { scale: 1.0 / (head_dim as f32).sqrt(), sliding_window: None, softcap: None }
    }
}

/// The sequences of a decode step: one new token per sequence, at its last position.
#[derive(Clone, Copy)]
pub struct DecodeBatch<'a> {
    /// u32 `[n_seqs]`: keys of the sequence, the new token's own included: the new token is at
    /// position `context_len - 1` and attends to keys `0 .. context_len`. A context of 0 yields a
    /// zero row and stores nothing; one longer than the block table row can address is clamped
    /// to it (and the new token is neither seen nor stored).
    pub context_lens: &'a Tensor,
    /// u32 `[n_seqs, max_blocks_per_seq]`: block ids (below `num_blocks`) in position order.
    pub block_table: &'a Tensor,
}

/// The query tokens of a prefill step: prompts or chunks of prompts of one or several sequences,
/// whose own K and V are already in the cache.
#[derive(Clone, Copy)]
pub struct PrefillBatch<'a> {
    /// u32 `[n_tokens]`: each token's row of the block table. A value past the table's rows (e.g.
    /// `u32::MAX` for padding) sees no keys and yields a zero row.
    pub seq_ids: &'a Tensor,
    /// u32 `[n_tokens]`: each token's position `p` in its sequence; it attends to keys `0 ..= p`
    /// (positions past the block table row's capacity are clamped to it). Tokens may come in any
    /// order; grouped by sequence with increasing positions is fastest.
    pub positions: &'a Tensor,
    /// u32 `[n_seqs, max_blocks_per_seq]`: block ids (below `num_blocks`) in position order.
    pub block_table: &'a Tensor,
}

/// The projections of a step's new tokens: f32 `[n_tokens, heads * head_dim]` each, before
/// any norm or rotation.
#[derive(Clone, Copy)]
pub struct Projections<'a> {
    /// Queries, `n_heads` per token.
    pub q: &'a Tensor,
    /// Keys, `n_kv_heads` per token.
    pub k: &'a Tensor,
    /// Values, `n_kv_heads` per token.
    pub v: &'a Tensor,
}

/// The per-head RMSNorms of queries and keys (Qwen 3, Gemma 3), as a model's weights give them.
#[derive(Clone, Copy, Debug)]
pub struct HeadNorms<'a> {
    /// The query heads' weight, `[head_dim]`.
    pub q: &'a [f32],
    /// The key heads' weight, `[head_dim]`.
    pub k: &'a [f32],
    /// How the weights scale.
    pub convention: NormWeight,
    /// Added to the mean square.
    pub eps: f32,
}

/// [`HeadNorms`] on the GPU.
struct HeadNormWeights {
    q: Tensor,
    k: Tensor,
    convention: NormWeight,
    eps: f32,
}

/// What becomes of new tokens' query and key heads between their projection and attention: an
/// RMSNorm of each head where the model has one, then the rotary embedding. One per layer.
///
/// A prefill step applies it in separate passes before the cache store
/// ([`HeadTransform::apply_and_store`]); [`decode`] applies it inside attention, from a copy of
/// the rope's turns and the norms' weights in one small uniform buffer.
pub struct HeadTransform {
    rope: Rope,
    norms: Option<HeadNormWeights>,
    /// `HeadConstants` of `attention_decode.wgsl`.
    constants: wgpu::Buffer,
}

impl HeadTransform {
    /// Checks `norms` against the rope's head size and uploads both.
    pub fn new(ctx: &GpuContext, rope: &RopeConfig<'_>, norms: Option<HeadNorms<'_>>) -> Result<Self> {
        const KERNEL: &str = "head transform";
        let rope = Rope::new(ctx, rope)?;
        let head_dim = rope.head_dim();
        ensure(KERNEL, head_dim.is_multiple_of(4) && (4..=MAX_HEAD_DIM).contains(&head_dim), || {
            format!("head_dim {head_dim} must be a multiple of 4 from 4 to {MAX_HEAD_DIM}")
        })?;
        // The turns, padded to whole vec4s, then the norms' scales and eps.
        let mut words: Vec<u32> = rope.turn_values().to_vec();
        words.resize(rope.rot_pairs().div_ceil(4) * 4, 0);
        let norms = match norms {
            None => None,
            Some(norms) => {
                ensure(KERNEL, norms.q.len() == head_dim && norms.k.len() == head_dim, || {
                    format!(
                        "the norms' weights have {} and {} elements; heads have {head_dim}",
                        norms.q.len(),
                        norms.k.len()
                    )
                })?;
                ensure(KERNEL, norms.eps.is_finite() && norms.eps >= 0.0, || {
                    format!("eps is {}; it must be finite and not negative", norms.eps)
                })?;
                for weight in [norms.q, norms.k] {
                    words.extend(weight.iter().map(|&w| match norms.convention {
                        NormWeight::Scale => w.to_bits(),
                        NormWeight::OnePlus => (1.0 + w).to_bits(),
                    }));
                }
                words.extend([norms.eps.to_bits(), 0, 0, 0]);
                Some(HeadNormWeights {
                    q: Tensor::from_slice(ctx, "q head norm", &[head_dim], norms.q)?,
                    k: Tensor::from_slice(ctx, "k head norm", &[head_dim], norms.k)?,
                    convention: norms.convention,
                    eps: norms.eps,
                })
            }
        };
        let constants = {
            use wgpu::util::DeviceExt;
            ctx.count_created_buffer();
            ctx.device().create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("head transform constants"),
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::UNIFORM,
            })
        };
        Ok(HeadTransform { rope, norms, constants })
    }

    /// The length of the heads it transforms.
    pub fn head_dim(&self) -> usize {
        self.rope.head_dim()
    }

    /// Records the transform of prefill tokens, then the store of their keys and values: the
    /// norms of `new.q` and `new.k` in place (if any), then [`rope_and_store_kv`].
    pub fn apply_and_store(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        new: &Projections<'_>,
        positions: &Tensor,
        cache: &KvCacheLayer<'_>,
        slots: &Tensor,
    ) -> Result<()> {
        if let Some(norms) = &self.norms {
            for (weight, x) in [(&norms.q, new.q), (&norms.k, new.k)] {
                let norm = RmsNorm { weight, convention: norms.convention, eps: norms.eps };
                rms_norm_in_place(ctx, encoder, &norm, x)?;
            }
        }
        rope_and_store_kv(ctx, encoder, &self.rope, new.q, new.k, new.v, positions, cache, slots)
    }

    /// A kernel that transforms heads as this does: `parts` after the rotation, with the rope's
    /// constants and HEAD_NORMS defined.
    fn kernel(&self, entry: &'static str, parts: &[&'static str]) -> KernelSource {
        self.rope.kernel(entry, parts).define("HEAD_NORMS", self.norms.is_some())
    }
}

/// Uniform parameters of both attention kernels (`AttentionParams` in `attention.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttentionParams {
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    n_seqs: u32,
    block_size: u32,
    max_blocks_per_seq: u32,
    window: u32,
    scale: f32,
    softcap: f32,
    key_span: u32,
    splits: u32,
    _pad: u32,
}

/// Uniform parameters of the combine pass of split decode (`attention_combine.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CombineParams {
    n_seqs: u32,
    n_heads: u32,
    n_kv_heads: u32,
    splits: u32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvStoreParams {
    row_vec4s: u32,
    n_tokens: u32,
    n_slots: u32,
    _pad: u32,
}

/// The dimensions of a [`KvCacheLayer`], checked.
#[derive(Clone, Copy, Debug)]
struct CacheGeometry {
    num_blocks: usize,
    block_size: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl CacheGeometry {
    fn of(kernel: &'static str, cache: &KvCacheLayer<'_>) -> Result<Self> {
        let shape = cache.k.shape();
        ensure(kernel, shape.len() == 4 && cache.v.shape() == shape, || {
            format!(
                "K {:?} and V {:?} must both be [num_blocks, block_size, n_kv_heads, head_dim / 2] words",
                shape,
                cache.v.shape()
            )
        })?;
        let geometry = CacheGeometry {
            num_blocks: shape[0],
            block_size: shape[1],
            n_kv_heads: shape[2],
            head_dim: shape[3] * 2,
        };
        ensure(
            kernel,
            geometry.num_blocks > 0 && geometry.block_size > 0 && geometry.n_kv_heads > 0,
            || format!("KV cache {shape:?} has an empty dimension"),
        )?;
        ensure(
            kernel,
            geometry.head_dim.is_multiple_of(4) && (4..=MAX_HEAD_DIM).contains(&geometry.head_dim),
            || format!("head_dim {} must be a multiple of 4 from 4 to {MAX_HEAD_DIM}", geometry.head_dim),
        )?;
        Ok(geometry)
    }

    fn slots(&self) -> usize {
        self.num_blocks * self.block_size
    }
}

/// Keys or values as the cache holds them: each pair of elements rounded to f16 (to nearest)
/// and packed into one word, the first in the low half. `values` has an even length.
pub fn pack_halves(values: &[f32]) -> Vec<u32> {
    values
        .chunks_exact(2)
        .map(|pair| {
            let half = |x: f32| u32::from(half::f16::from_f32(x).to_bits());
            half(pair[0]) | (half(pair[1]) << 16)
        })
        .collect()
}

/// The elements of cache words, as [`pack_halves`] packs them.
pub fn unpack_halves(words: &[u32]) -> Vec<f32> {
    let half = |bits: u32| half::f16::from_bits(bits as u16).to_f32();
    words.iter().flat_map(|&w| [half(w & 0xffff), half(w >> 16)]).collect()
}

/// Records the write of new tokens' keys and values into the cache: row `t` of `k_new` and
/// `v_new` (f32 `[n_tokens, n_kv_heads * head_dim]`), rounded to f16, goes to slot `slots[t]` (u32 `[n_tokens]`,
/// `block * block_size + offset`). A slot past the cache (e.g. `u32::MAX` for padding) is skipped.
/// Two tokens with the same slot leave an unspecified mix of their rows there.
pub fn store_kv(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    cache: &KvCacheLayer<'_>,
    k_new: &Tensor,
    v_new: &Tensor,
    slots: &Tensor,
) -> Result<()> {
    const KERNEL: &str = "kv_store";
    let geometry = CacheGeometry::of(KERNEL, cache)?;
    let row = geometry.n_kv_heads * geometry.head_dim;
    let n_tokens = slots.len();
    ensure(KERNEL, k_new.len() == n_tokens * row && v_new.len() == n_tokens * row, || {
        format!(
            "k_new has {} and v_new {} elements; {n_tokens} slots of n_kv_heads * head_dim = {row} need {}",
            k_new.len(),
            v_new.len(),
            n_tokens * row
        )
    })?;
    if n_tokens == 0 {
        return Ok(());
    }
    let row_vec4s = (row / 4) as u32;
    let params = encoder.params(
        ctx,
        &KvStoreParams { row_vec4s, n_tokens: n_tokens as u32, n_slots: geometry.slots() as u32, _pad: 0 },
    )?;
    let source = KernelSource::new(KERNEL, &[KV_HALVES, KV_STORE]).define("WG", format!("{KV_STORE_WG}u"));
    ctx.dispatch(
        encoder,
        &source,
        &[
            params.binding(),
            k_new.binding(),
            v_new.binding(),
            slots.binding(),
            cache.k.binding(),
            cache.v.binding(),
        ],
        ctx.grid((n_tokens as u32 * row_vec4s).div_ceil(KV_STORE_WG)),
    )
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeKvParams {
    n_tokens: u32,
    q_heads: u32,
    kv_heads: u32,
    n_slots: u32,
}

/// Records, in one pass, what [`rope`](crate::kernels::rope::rope) of `q`, `rope` of `k` and
/// [`store_kv`] of the rotated keys and `v` do in three: q (`[n_tokens, q_heads * head_dim]`)
/// is rotated in place; k and v (`[n_tokens, n_kv_heads * head_dim]`) are left as they are,
/// the rotated keys and the values written to the tokens' `slots` in the cache. `positions`
/// and `slots` hold one u32 per token; a slot past the cache stores nothing.
#[allow(clippy::too_many_arguments)]
pub fn rope_and_store_kv(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    rope: &Rope,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    positions: &Tensor,
    cache: &KvCacheLayer<'_>,
    slots: &Tensor,
) -> Result<()> {
    const KERNEL: &str = "rope_kv";
    let geometry = CacheGeometry::of(KERNEL, cache)?;
    let head_dim = geometry.head_dim;
    let n_tokens = slots.len();
    let row = geometry.n_kv_heads * head_dim;
    ensure(KERNEL, rope.head_dim() == head_dim, || {
        format!("the rope rotates heads of {} and the cache holds heads of {head_dim}", rope.head_dim())
    })?;
    ensure(
        KERNEL,
        positions.len() == n_tokens
            && k.len() == n_tokens * row
            && v.len() == n_tokens * row
            && q.len().is_multiple_of(head_dim)
            && (q.len() / head_dim).is_multiple_of(n_tokens.max(1)),
        || {
            format!(
                "{n_tokens} slots and {} positions, q of {} elements, k of {} and v of {}: there must be \
                 one position per slot, q [tokens, heads * {head_dim}] and k and v [tokens, {row}]",
                positions.len(),
                q.len(),
                k.len(),
                v.len()
            )
        },
    )?;
    if n_tokens == 0 {
        return Ok(());
    }
    let q_heads = q.len() / head_dim / n_tokens;
    let items = n_tokens as u64 * (q_heads + geometry.n_kv_heads) as u64 * (head_dim / 2) as u64;
    ensure(KERNEL, items < u64::from(u32::MAX), || {
        format!("{items} work items are too many for one dispatch")
    })?;
    let params = encoder.params(
        ctx,
        &RopeKvParams {
            n_tokens: n_tokens as u32,
            q_heads: q_heads as u32,
            kv_heads: geometry.n_kv_heads as u32,
            n_slots: geometry.slots() as u32,
        },
    )?;
    ctx.dispatch(
        encoder,
        &rope.kernel(KERNEL, &[ROPE_KV]).define("WG_SIZE", format!("{ROPE_KV_WG}u")),
        &[
            params.binding(),
            rope.turns().binding(),
            positions.binding(),
            slots.binding(),
            q.binding(),
            k.binding(),
            v.binding(),
            cache.k.binding(),
            cache.v.binding(),
        ],
        ctx.grid((items as u32).div_ceil(ROPE_KV_WG)),
    )
}

/// Records a decode step's attention, one new token per sequence: sequence `s`'s token at
/// position `context_lens[s] - 1` has its query and key heads transformed by `heads` (norm,
/// rope); its key and value are written to its slot in the cache, for later steps; each query
/// head `h` attends to the sequence's keys `0 .. context_lens[s]` (its own included), and the
/// result goes to `out[s, h]`. `new` holds one row per sequence; `out` has `new.q`'s shape.
#[allow(clippy::too_many_arguments)]
pub fn decode(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    heads: &HeadTransform,
    new: &Projections<'_>,
    cache: &KvCacheLayer<'_>,
    batch: &DecodeBatch<'_>,
    options: &AttentionOptions,
    out: &Tensor,
) -> Result<()> {
    decode_as(ctx, encoder, heads, new, cache, batch, options, out, None)
}

/// [`decode`] in the given variant, or the device's own when `None`.
#[allow(clippy::too_many_arguments)]
fn decode_as(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    heads: &HeadTransform,
    new: &Projections<'_>,
    cache: &KvCacheLayer<'_>,
    batch: &DecodeBatch<'_>,
    options: &AttentionOptions,
    out: &Tensor,
    variant: Option<DecodeVariant>,
) -> Result<()> {
    const KERNEL: &str = "attention_decode";
    let geometry = CacheGeometry::of(KERNEL, cache)?;
    let n_seqs = batch.context_lens.len();
    let n_heads = query_heads(KERNEL, new.q, out, n_seqs, &geometry)?;
    let kv_row = geometry.n_kv_heads * geometry.head_dim;
    ensure(KERNEL, new.k.len() == n_seqs * kv_row && new.v.len() == n_seqs * kv_row, || {
        format!(
            "k has {} and v {} elements; {n_seqs} sequences of n_kv_heads * head_dim = {kv_row} need {}",
            new.k.len(),
            new.v.len(),
            n_seqs * kv_row
        )
    })?;
    ensure(KERNEL, heads.head_dim() == geometry.head_dim, || {
        format!(
            "the head transform takes heads of {} and the cache holds heads of {}",
            heads.head_dim(),
            geometry.head_dim
        )
    })?;
    let max_blocks = block_table_width(KERNEL, batch.block_table)?;
    ensure(KERNEL, batch.block_table.shape()[0] == n_seqs, || {
        format!("the block table has {} rows for {n_seqs} sequences", batch.block_table.shape()[0])
    })?;
    let mut params = attention_params(KERNEL, options, &geometry, n_seqs, n_heads, n_seqs, max_blocks)?;
    if n_seqs == 0 {
        return Ok(());
    }
    let chunk_heads = decode_group_heads(n_heads / geometry.n_kv_heads);
    let key_capacity = max_blocks * geometry.block_size;
    let variant = variant.unwrap_or_else(|| {
        tuning::decode_variant(
            ctx,
            n_seqs * n_heads / chunk_heads,
            chunk_heads,
            geometry.head_dim,
            key_capacity,
        )
    });
    // The serial variant may serve fewer heads at a time than a chunk.
    let group_heads = match variant {
        DecodeVariant::Workgroups | DecodeVariant::Split { .. } => chunk_heads,
        DecodeVariant::Serial { group_heads, .. } => group_heads,
    };
    let kv_textures = matches!(variant, DecodeVariant::Serial { kv_textures: true, .. });
    let views = kv_snapshot(ctx, encoder, cache, kv_textures);
    let source = decode_source(heads, group_heads, variant).define("KV_TEXTURES", views.is_some());
    let groups = n_seqs * n_heads / group_heads;
    // Split: the partial results go to a buffer of their own, and a second pass combines them.
    let (splits, partials) = match variant {
        DecodeVariant::Split { key_span } => {
            let splits = key_capacity.div_ceil(key_span).max(1);
            params.key_span = key_span as u32;
            params.splits = splits as u32;
            let floats = groups * splits * group_heads * (geometry.head_dim + 4);
            (splits, Some(Tensor::empty(ctx, "attention partials", &[floats])?))
        }
        _ => (1, None),
    };
    let params = encoder.params(ctx, &params)?;
    let workgroups = groups * splits;
    let mut bindings = vec![
        params.binding(),
        heads.constants.as_entire_binding(),
        new.q.binding(),
        new.k.binding(),
        new.v.binding(),
        cache.k.binding(),
        cache.v.binding(),
        batch.context_lens.binding(),
        batch.block_table.binding(),
        partials.as_ref().unwrap_or(out).binding(),
    ];
    if let Some(views) = &views {
        bindings.extend(views.iter().map(wgpu::BindingResource::TextureView));
    }
    ctx.dispatch(encoder, &source, &bindings, ctx.grid(workgroups as u32))?;
    let Some(partials) = partials else {
        return Ok(());
    };
    let combine = encoder.params(
        ctx,
        &CombineParams {
            n_seqs: n_seqs as u32,
            n_heads: n_heads as u32,
            n_kv_heads: geometry.n_kv_heads as u32,
            splits: splits as u32,
        },
    )?;
    let outputs = (out.len() / 4) as u32;
    ctx.dispatch(
        encoder,
        &combine_source(geometry.head_dim, group_heads),
        &[combine.binding(), partials.binding(), out.binding()],
        ctx.grid(outputs.div_ceil(DECODE_WG)),
    )
}

/// Records causal prefill attention: for each token `t` and query head `h`, row `q[t, h]` (f32
/// `[n_tokens, n_heads, head_dim]`, or `[n_tokens, n_heads * head_dim]`) attends to the keys at
/// positions `0 ..= positions[t]` of sequence `seq_ids[t]` and the result goes to `out[t, h]`
/// (same shape as `q`).
pub fn prefill(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    q: &Tensor,
    cache: &KvCacheLayer<'_>,
    batch: &PrefillBatch<'_>,
    options: &AttentionOptions,
    out: &Tensor,
) -> Result<()> {
    prefill_as(ctx, encoder, q, cache, batch, options, out, None)
}

/// [`prefill`] in the given variant, or the device's own when `None`.
#[allow(clippy::too_many_arguments)]
fn prefill_as(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    q: &Tensor,
    cache: &KvCacheLayer<'_>,
    batch: &PrefillBatch<'_>,
    options: &AttentionOptions,
    out: &Tensor,
    variant: Option<PrefillVariant>,
) -> Result<()> {
    const KERNEL: &str = "attention_prefill";
    let geometry = CacheGeometry::of(KERNEL, cache)?;
    let n_tokens = batch.seq_ids.len();
    ensure(KERNEL, batch.positions.len() == n_tokens, || {
        format!("{} positions for {n_tokens} seq_ids", batch.positions.len())
    })?;
    let n_heads = query_heads(KERNEL, q, out, n_tokens, &geometry)?;
    let max_blocks = block_table_width(KERNEL, batch.block_table)?;
    let n_seqs = batch.block_table.shape()[0];
    let params = attention_params(KERNEL, options, &geometry, n_tokens, n_heads, n_seqs, max_blocks)?;
    if n_tokens == 0 {
        return Ok(());
    }
    let params = encoder.params(ctx, &params)?;
    let chunk_heads = decode_group_heads(n_heads / geometry.n_kv_heads);
    let variant = variant.unwrap_or_else(|| tuning::prefill_variant(ctx, chunk_heads, geometry.head_dim));
    let (workgroups, kv_textures) = match variant {
        PrefillVariant::Workgroups => (n_tokens.div_ceil(PREFILL_ROWS as usize) * n_heads, false),
        PrefillVariant::Serial { group_heads, rows, kv_textures } => {
            (n_tokens.div_ceil(rows) * n_heads / group_heads, kv_textures)
        }
    };
    let views = kv_snapshot(ctx, encoder, cache, kv_textures);
    // The keys and values: the textures in place of the buffers, where they were copied.
    let [keys, values] = match &views {
        Some([k, v]) => [wgpu::BindingResource::TextureView(k), wgpu::BindingResource::TextureView(v)],
        None => [cache.k.binding(), cache.v.binding()],
    };
    let bindings = [
        params.binding(),
        q.binding(),
        keys,
        values,
        batch.seq_ids.binding(),
        batch.positions.binding(),
        batch.block_table.binding(),
        out.binding(),
    ];
    let source = prefill_source(geometry.head_dim, variant).define("KV_TEXTURES", views.is_some());
    ctx.dispatch(encoder, &source, &bindings, ctx.grid(workgroups as u32))
}

/// Where `wanted` and the layer's cache fits them: two textures ([`GpuContext::scratch_textures`])
/// with copies of its keys and values recorded into them (the blocks in use: a cache sized for a
/// long context costs only what it holds), as views for a serial kernel built with KV_TEXTURES
/// to read instead of the cache's buffers.
fn kv_snapshot(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    cache: &KvCacheLayer,
    wanted: bool,
) -> Option<[wgpu::TextureView; 2]> {
    if !wanted {
        return None;
    }
    let num_blocks = cache.k.shape().first().copied().unwrap_or(0);
    let words = cache.k.len() / num_blocks.max(1) * cache.blocks_in_use.min(num_blocks);
    if words == 0 {
        return None;
    }
    let textures = ctx.scratch_textures(words)?;
    let bytes = (words * 4) as u64;
    for (tensor, scratch) in [cache.k, cache.v].into_iter().zip(&textures) {
        record_copy_to_texture(encoder.raw(), tensor.buffer(), bytes, &scratch.texture);
    }
    Some(textures.map(|scratch| scratch.view))
}

/// Checks `q` and `out` against `rows` query rows and the cache's heads; returns n_heads.
fn query_heads(
    kernel: &'static str,
    q: &Tensor,
    out: &Tensor,
    rows: usize,
    geometry: &CacheGeometry,
) -> Result<usize> {
    let row_heads = rows * geometry.head_dim;
    let n_heads = q.len().checked_div(row_heads).unwrap_or(0);
    ensure(
        kernel,
        q.shape().first() == Some(&rows) && q.len() == n_heads * row_heads && out.shape() == q.shape(),
        || {
            format!(
                "q {:?} and out {:?} must be the same [{rows}, n_heads, head_dim = {}] (or [{rows}, n_heads * \
                 head_dim]) for {rows} query rows",
                q.shape(),
                out.shape(),
                geometry.head_dim
            )
        },
    )?;
    ensure(kernel, rows == 0 || (n_heads > 0 && n_heads.is_multiple_of(geometry.n_kv_heads)), || {
        format!("{n_heads} query heads are not a positive multiple of {} kv heads", geometry.n_kv_heads)
    })?;
    Ok(n_heads)
}

/// Checks that a block table is `[n_seqs, max_blocks_per_seq]` with a non-zero width; returns it.
fn block_table_width(kernel: &'static str, block_table: &Tensor) -> Result<usize> {
    let shape = block_table.shape();
    ensure(kernel, shape.len() == 2 && shape[1] > 0, || {
        format!("the block table {shape:?} must be [n_seqs, max_blocks_per_seq > 0]")
    })?;
    Ok(shape[1])
}

fn attention_params(
    kernel: &'static str,
    options: &AttentionOptions,
    geometry: &CacheGeometry,
    n_rows: usize,
    n_heads: usize,
    n_seqs: usize,
    max_blocks_per_seq: usize,
) -> Result<AttentionParams> {
    ensure(kernel, options.scale.is_finite(), || format!("scale {} must be finite", options.scale))?;
    ensure(kernel, options.sliding_window != Some(0), || {
        "a sliding window of 0 tokens hides every key; use None for no window".to_string()
    })?;
    ensure(kernel, options.softcap.is_none_or(|cap| cap.is_finite() && cap > 0.0), || {
        format!("softcap {:?} must be finite and positive (None for no soft-cap)", options.softcap)
    })?;
    // Positions are u32 in the kernels: every key of a full table row must have one.
    ensure(
        kernel,
        max_blocks_per_seq.checked_mul(geometry.block_size).is_some_and(|c| c <= u32::MAX as usize),
        || {
            format!(
                "{max_blocks_per_seq} blocks of {} tokens per sequence overflow u32 positions",
                geometry.block_size
            )
        },
    )?;
    Ok(AttentionParams {
        n_rows: n_rows as u32,
        n_heads: n_heads as u32,
        n_kv_heads: geometry.n_kv_heads as u32,
        n_seqs: n_seqs as u32,
        block_size: geometry.block_size as u32,
        max_blocks_per_seq: max_blocks_per_seq as u32,
        window: options.sliding_window.unwrap_or(0),
        scale: options.scale,
        softcap: options.softcap.unwrap_or(0.0),
        key_span: 0,
        splits: 0,
        _pad: 0,
    })
}

/// Query heads per decode workgroup for `group` query heads per kv head: the largest divisor of
/// `group` up to [`DECODE_MAX_GROUP_HEADS`], so that every workgroup serves a full chunk.
fn decode_group_heads(group: usize) -> usize {
    (1..=DECODE_MAX_GROUP_HEADS.min(group)).rev().find(|d| group.is_multiple_of(*d)).unwrap_or(1)
}

/// How decode attention spreads its work; `tuning::decode_variant` picks the device's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecodeVariant {
    /// A workgroup per (sequence, kv head, chunk of query heads), keys in tiles shared through
    /// workgroup memory: GPUs, when those workgroups are enough to fill the device.
    Workgroups,
    /// As `Workgroups`, but a workgroup per span of `key_span` keys of each (sequence, kv head,
    /// chunk), and a second pass that combines their partial softmaxes (flash-decoding): GPUs,
    /// when a step has too few groups to keep the device busy.
    Split { key_span: usize },
    /// A workgroup of [`DECODE_SERIAL_WG`] lanes in one subgroup per (sequence, kv head, chunk
    /// of `group_heads` query heads), the lanes splitting the heads' dims and walking the keys
    /// together, one at a time (a `subgroupAdd` makes each score): CPU devices with subgroups,
    /// where invocations are SIMD lanes of one thread, a tile of keys in workgroup memory costs
    /// every lane a loop over it, and private arrays too long to unroll live in memory. With
    /// `kv_textures` the layer's cached keys and values are copied into two textures
    /// ([`GpuContext::scratch_textures`]) before the dispatch, which reads them from there: a
    /// texture load is a gather on lavapipe, a storage load a loop over the lanes.
    Serial { group_heads: usize, kv_textures: bool },
}

fn decode_source(heads: &HeadTransform, group_heads: usize, variant: DecodeVariant) -> KernelSource {
    let parts: &[&'static str] = match variant {
        DecodeVariant::Workgroups | DecodeVariant::Split { .. } => &[KV_HALVES, COMMON, DECODE, DECODE_GPU],
        DecodeVariant::Serial { .. } => &[KV_HALVES, COMMON, SERIAL, DECODE, DECODE_SERIAL],
    };
    let source = heads
        .kernel("attention_decode", parts)
        .define("GROUP_HEADS", format!("{group_heads}u"))
        .define("TEXTURE_WIDTH", format!("{TEXTURE_WIDTH}u"));
    match variant {
        DecodeVariant::Workgroups => source.define("WG", format!("{DECODE_WG}u")),
        DecodeVariant::Split { .. } => source.define("WG", format!("{DECODE_WG}u")).define("SPLIT", true),
        DecodeVariant::Serial { .. } => source.define("WG", format!("{DECODE_SERIAL_WG}u")),
    }
}

fn combine_source(head_dim: usize, group_heads: usize) -> KernelSource {
    KernelSource::new("attention_combine", &[COMBINE])
        .define("HEAD_DIM", format!("{head_dim}u"))
        .define("GROUP_HEADS", format!("{group_heads}u"))
        .define("WG", format!("{DECODE_WG}u"))
}

/// How prefill attention spreads its work; `tuning::prefill_variant` picks the device's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrefillVariant {
    /// A workgroup per (tile of [`PREFILL_ROWS`] tokens, query head), keys in tiles shared
    /// through workgroup memory: GPUs.
    Workgroups,
    /// A workgroup of [`DECODE_SERIAL_WG`] lanes in one subgroup per (tile of `rows` tokens, kv
    /// head, chunk of `group_heads` query heads), the lanes splitting the heads' dims and walking
    /// the keys together, as in [`DecodeVariant::Serial`]: CPU devices with subgroups.
    /// With `kv_textures`, as [`DecodeVariant::Serial`].
    Serial { group_heads: usize, rows: usize, kv_textures: bool },
}

fn prefill_source(head_dim: usize, variant: PrefillVariant) -> KernelSource {
    let head_dim_define = format!("{head_dim}u");
    match variant {
        PrefillVariant::Workgroups => {
            KernelSource::new("attention_prefill", &[KV_HALVES, COMMON, PREFILL, PREFILL_GPU])
                .define("HEAD_DIM", head_dim_define)
                .define("ROWS", format!("{PREFILL_ROWS}u"))
                .define("LANES", format!("{PREFILL_LANES}u"))
                .define("TILE_KEYS", format!("{}u", prefill_tile_keys(head_dim)))
        }
        PrefillVariant::Serial { group_heads, rows, .. } => {
            KernelSource::new("attention_prefill", &[KV_HALVES, COMMON, SERIAL, PREFILL, PREFILL_SERIAL])
                .define("HEAD_DIM", head_dim_define)
                .define("TEXTURE_WIDTH", format!("{TEXTURE_WIDTH}u"))
                .define("ROWS", format!("{rows}u"))
                .define("WG", format!("{DECODE_SERIAL_WG}u"))
                .define("GROUP_HEADS", format!("{group_heads}u"))
        }
    }
}

/// Keys per K/V tile of the prefill kernel: as many as fit in 16 KiB of workgroup memory next to
/// their partial dot products and the row bookkeeping, at most 16 (larger tiles waste more work
/// on masked keys at the causal diagonal).
fn prefill_tile_keys(head_dim: usize) -> u32 {
    let invocations = (PREFILL_ROWS * PREFILL_LANES) as usize;
    // row_seq, row_first_key and row_end_key, then run_info.
    let bookkeeping_bytes = 3 * 4 * PREFILL_ROWS as usize + 16;
    // One key of k_tile and v_tile, and of partial_dots.
    let bytes_per_key = 2 * 4 * head_dim + 4 * invocations;
    ((WORKGROUP_BYTES - bookkeeping_bytes) / bytes_per_key).min(16) as u32
}

#[cfg(test)]
mod tests;

#[cfg(feature = "kernel-timing")]
#[doc(hidden)]
pub mod timing;
