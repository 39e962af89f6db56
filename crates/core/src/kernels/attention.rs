//! Attention over a paged KV cache (`shaders/attention*.wgsl`, `shaders/kv_store.wgsl`,
//! `shaders/rope_kv.wgsl`): storing the keys and values of new tokens, decode attention (one new
//! token per sequence) and causal prefill attention (many rows, several sequences, chunks after
//! cached tokens).
//!
//! The cache of one layer ([`KvCacheLayer`]) is two f32 tensors K and V, each
//! `[num_blocks, block_size, n_kv_heads, head_dim]`. A sequence owns blocks listed in order in its
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
//! // 4 blocks of 16 tokens, 2 kv heads of 64; one sequence whose third token (position 2) is
//! // new, in blocks 2 and 0.
//! let (k, v) = (Tensor::empty(&ctx, "k", &[4, 16, 2, 64])?, Tensor::empty(&ctx, "v", &[4, 16, 2, 64])?);
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

const COMMON: &str = include_str!("../../shaders/attention.wgsl");
const DECODE: &str = include_str!("../../shaders/attention_decode.wgsl");
const COMBINE: &str = include_str!("../../shaders/attention_combine.wgsl");
const PREFILL: &str = include_str!("../../shaders/attention_prefill.wgsl");
const KV_STORE: &str = include_str!("../../shaders/kv_store.wgsl");
const ROPE_KV: &str = include_str!("../../shaders/rope_kv.wgsl");

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

/// One layer's paged KV cache: K and V, each an f32 tensor
/// `[num_blocks, block_size, n_kv_heads, head_dim]` in one storage binding, so each is at most
/// [`GpuContext::max_binding_bytes`] (128 MiB on lavapipe).
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
                "K {:?} and V {:?} must both be [num_blocks, block_size, n_kv_heads, head_dim]",
                shape,
                cache.v.shape()
            )
        })?;
        let geometry = CacheGeometry {
            num_blocks: shape[0],
            block_size: shape[1],
            n_kv_heads: shape[2],
            head_dim: shape[3],
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

/// Records the write of new tokens' keys and values into the cache: row `t` of `k_new` and
/// `v_new` (f32 `[n_tokens, n_kv_heads * head_dim]`) goes to slot `slots[t]` (u32 `[n_tokens]`,
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
    let source = KernelSource::new(KERNEL, &[KV_STORE]).define("WG", format!("{KV_STORE_WG}u"));
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
    for (tensor, texture) in [cache.k, cache.v].into_iter().zip(&textures) {
        record_copy_to_texture(encoder.raw(), tensor.buffer(), bytes, texture);
    }
    Some(textures.map(|t| t.create_view(&wgpu::TextureViewDescriptor::default())))
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
    let source = heads
        .kernel("attention_decode", &[COMMON, DECODE])
        .define("GROUP_HEADS", format!("{group_heads}u"))
        .define("TEXTURE_WIDTH", format!("{TEXTURE_WIDTH}u"));
    match variant {
        DecodeVariant::Workgroups => source.define("WG", format!("{DECODE_WG}u")),
        DecodeVariant::Split { .. } => source.define("WG", format!("{DECODE_WG}u")).define("SPLIT", true),
        DecodeVariant::Serial { .. } => {
            source.define("WG", format!("{DECODE_SERIAL_WG}u")).define("SERIAL", true)
        }
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
    let source =
        KernelSource::new("attention_prefill", &[COMMON, PREFILL]).define("HEAD_DIM", format!("{head_dim}u"));
    match variant {
        PrefillVariant::Workgroups => source
            .define("ROWS", format!("{PREFILL_ROWS}u"))
            .define("LANES", format!("{PREFILL_LANES}u"))
            .define("TILE_KEYS", format!("{}u", prefill_tile_keys(head_dim))),
        PrefillVariant::Serial { group_heads, rows, .. } => source
            .define("TEXTURE_WIDTH", format!("{TEXTURE_WIDTH}u"))
            .define("ROWS", format!("{rows}u"))
            .define("WG", format!("{DECODE_SERIAL_WG}u"))
            .define("GROUP_HEADS", format!("{group_heads}u"))
            .define("SERIAL", true),
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
mod tests {
    use super::*;
    use crate::gpu::DeviceClass;
    use crate::kernels::norm::tests::reference as norm_reference;
    use crate::kernels::rope::RopeLayout;
    use crate::kernels::rope::tests::{
        config as rope_config, reference as rope_reference, tolerance as rope_tolerance,
    };
    use crate::kernels::testing::{POISON, Rng, assert_close, gpu, validate_wgsl};
    use crate::tuning::{SERIAL_MAX_HEAD_VALUES, serial_max_group_heads};

    /// Bound on the relative error of f32 attention against the f64 reference: softmax weights and
    /// weighted sums over a few hundred keys lose a few ulps each.
    const ATTENTION_TOLERANCE: f32 = 3e-5;

    /// A CPU image of one layer's paged cache, and the block table row of each sequence.
    struct PagedCache {
        num_blocks: usize,
        block_size: usize,
        n_kv_heads: usize,
        head_dim: usize,
        k: Vec<f32>,
        v: Vec<f32>,
        /// `[n_seqs][max_blocks_per_seq]`; entries past a sequence's blocks name a spare block.
        tables: Vec<Vec<u32>>,
    }

    impl PagedCache {
        /// A cache with room for sequences of `capacities` tokens, each given its blocks from a
        /// shuffled pool. Every slot starts as NaN, so a kernel reading a key it must not see
        /// fails; the tables' unused entries point at a spare all-NaN block.
        fn new(
            rng: &mut Rng,
            capacities: &[usize],
            block_size: usize,
            n_kv_heads: usize,
            head_dim: usize,
        ) -> Self {
            let blocks_needed: Vec<usize> = capacities.iter().map(|c| c.div_ceil(block_size)).collect();
            let num_blocks = blocks_needed.iter().sum::<usize>() + 2;
            let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
            for i in (1..pool.len()).rev() {
                pool.swap(i, rng.usize(0, i + 1));
            }
            let spare = pool.pop().unwrap();
            let max_blocks = blocks_needed.iter().max().unwrap() + 1;
            let tables = blocks_needed
                .iter()
                .map(|&n| {
                    let mut row: Vec<u32> = (0..n).map(|_| pool.pop().unwrap()).collect();
                    row.resize(max_blocks, spare);
                    row
                })
                .collect();
            let elements = num_blocks * block_size * n_kv_heads * head_dim;
            let nan = f32::from_bits(POISON);
            PagedCache {
                num_blocks,
                block_size,
                n_kv_heads,
                head_dim,
                k: vec![nan; elements],
                v: vec![nan; elements],
                tables,
            }
        }

        fn slot(&self, seq: usize, position: usize) -> usize {
            self.tables[seq][position / self.block_size] as usize * self.block_size
                + position % self.block_size
        }

        /// Random keys and values (each `[n_kv_heads * head_dim]`) for one token.
        fn random_row(&self, rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
            let row = self.n_kv_heads * self.head_dim;
            (rng.f32s(row, -1.0, 1.0), rng.f32s(row, -1.0, 1.0))
        }

        fn write(&mut self, slot: usize, k: &[f32], v: &[f32]) {
            let row = self.n_kv_heads * self.head_dim;
            self.k[slot * row..(slot + 1) * row].copy_from_slice(k);
            self.v[slot * row..(slot + 1) * row].copy_from_slice(v);
        }

        /// Fills positions `0 .. len` of sequence `seq` with random keys and values.
        fn fill(&mut self, rng: &mut Rng, seq: usize, len: usize) {
            for position in 0..len {
                let (k, v) = self.random_row(rng);
                self.write(self.slot(seq, position), &k, &v);
            }
        }

        fn shape(&self) -> [usize; 4] {
            [self.num_blocks, self.block_size, self.n_kv_heads, self.head_dim]
        }

        fn upload(&self, ctx: &GpuContext) -> (Tensor, Tensor) {
            (
                Tensor::from_slice(ctx, "k_cache", &self.shape(), &self.k).unwrap(),
                Tensor::from_slice(ctx, "v_cache", &self.shape(), &self.v).unwrap(),
            )
        }

        fn table_tensor(&self, ctx: &GpuContext) -> Tensor {
            let flat: Vec<u32> = self.tables.concat();
            Tensor::from_slice(ctx, "block_table", &[self.tables.len(), self.tables[0].len()], &flat).unwrap()
        }

        /// Paged attention in f64 for one query row `q` (`[head_dim]`) of sequence `seq` at
        /// `position`, reading kv head `kv_head` through the block table.
        fn attend(
            &self,
            q: &[f32],
            seq: usize,
            position: usize,
            kv_head: usize,
            options: &AttentionOptions,
        ) -> Vec<f32> {
            let first = match options.sliding_window {
                Some(w) => (position + 1).saturating_sub(w as usize),
                None => 0,
            };
            let at = |slot: usize| (slot * self.n_kv_heads + kv_head) * self.head_dim;
            let logits: Vec<(usize, f64)> = (first..=position)
                .map(|j| {
                    let k = &self.k[at(self.slot(seq, j))..][..self.head_dim];
                    let dot: f64 = q.iter().zip(k).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                    let logit = dot * f64::from(options.scale);
                    let logit = match options.softcap {
                        Some(cap) => f64::from(cap) * (logit / f64::from(cap)).tanh(),
                        None => logit,
                    };
                    (self.slot(seq, j), logit)
                })
                .collect();
            let max = logits.iter().map(|&(_, l)| l).fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = logits.iter().map(|&(_, l)| (l - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            let mut out = vec![0.0f64; self.head_dim];
            for (&(slot, _), w) in logits.iter().zip(&weights) {
                let v = &self.v[at(slot)..][..self.head_dim];
                for (o, &x) in out.iter_mut().zip(v) {
                    *o += w / sum * f64::from(x);
                }
            }
            out.into_iter().map(|x| x as f32).collect()
        }
    }

    #[derive(Clone, Copy, Debug)]
    struct Heads {
        head_dim: usize,
        n_heads: usize,
        n_kv_heads: usize,
    }

    fn options(
        rng: &mut Rng,
        heads: Heads,
        sliding_window: Option<u32>,
        softcap: Option<f32>,
    ) -> AttentionOptions {
        // Scales away from 1/sqrt(head_dim) too, so that a kernel that ignores it fails.
        let scale = rng.f32(0.5, 1.5) / (heads.head_dim as f32).sqrt();
        AttentionOptions { scale, sliding_window, softcap }
    }

    /// Queries spread wider than the keys: logits then vary by several units, so the softmax is
    /// far from uniform and the soft-cap (at 3 to 5) bends them.
    fn random_queries(rng: &mut Rng, rows: usize, heads: Heads) -> Vec<f32> {
        rng.f32s(rows * heads.n_heads * heads.head_dim, -6.0, 6.0)
    }

    /// The kind of head transform a decode test runs.
    #[derive(Clone, Copy, Debug)]
    struct Transform {
        layout: RopeLayout,
        /// Rotated dims; `None` for all of them.
        rotated_dims: Option<usize>,
        /// Per-head norms of that convention, or none.
        norms: Option<NormWeight>,
    }

    /// Llama's: every dim rotated in interleaved pairs, no norms.
    const LLAMA_HEADS: Transform =
        Transform { layout: RopeLayout::Interleaved, rotated_dims: None, norms: None };
    /// Gemma 3's and Qwen 3's: norms, then NeoX rotation of every dim.
    const NORMED_HEADS: Transform =
        Transform { layout: RopeLayout::NeoX, rotated_dims: None, norms: Some(NormWeight::Scale) };

    /// A head transform of `kind` with random norm weights and rope base, and the CPU image of what
    /// it does to `x` (`[tokens, heads * head_dim]`, token `t` at `positions[t]`).
    struct TestHeads {
        gpu: HeadTransform,
        config: RopeConfig<'static>,
        norms: Option<(Vec<f32>, Vec<f32>, NormWeight, f32)>,
    }

    impl TestHeads {
        fn new(ctx: &GpuContext, rng: &mut Rng, kind: Transform, head_dim: usize) -> Self {
            let rotated_dims = kind.rotated_dims.unwrap_or(head_dim);
            let config =
                RopeConfig { base: rng.f32(5e3, 1e6), ..rope_config(head_dim, rotated_dims, kind.layout) };
            let norms = kind.norms.map(|convention| {
                (
                    rng.f32s(head_dim, -2.0, 2.0),
                    rng.f32s(head_dim, -2.0, 2.0),
                    convention,
                    rng.f32(1e-6, 1e-4),
                )
            });
            let head_norms = norms.as_ref().map(|(q, k, convention, eps)| HeadNorms {
                q,
                k,
                convention: *convention,
                eps: *eps,
            });
            TestHeads { gpu: HeadTransform::new(ctx, &config, head_norms).unwrap(), config, norms }
        }

        fn apply(&self, x: &[f32], positions: &[u32], is_key: bool) -> Vec<f32> {
            let normed = match &self.norms {
                Some((q, k, convention, eps)) => {
                    norm_reference(x, if is_key { k } else { q }, *convention, *eps)
                }
                None => x.to_vec(),
            };
            rope_reference(&normed, positions, &self.config)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_decode(
        name: &str,
        heads: Heads,
        block_size: usize,
        context_lens: &[usize],
        sliding_window: Option<u32>,
        softcap: Option<f32>,
        transform: Transform,
    ) {
        let ctx = gpu();
        let mut rng = Rng::new(name);
        let mut cache = PagedCache::new(&mut rng, context_lens, block_size, heads.n_kv_heads, heads.head_dim);
        // Every position but the new token's is cached; its slot stays NaN.
        for (seq, &len) in context_lens.iter().enumerate() {
            cache.fill(&mut rng, seq, len.saturating_sub(1));
        }
        let (k_before, v_before) = cache.upload(ctx);
        let (k_before, v_before) = (read_bits(ctx, &k_before), read_bits(ctx, &v_before));
        let options = options(&mut rng, heads, sliding_window, softcap);
        let test_heads = TestHeads::new(ctx, &mut rng, transform, heads.head_dim);
        let n_seqs = context_lens.len();
        let kv_row = heads.n_kv_heads * heads.head_dim;
        let q = random_queries(&mut rng, n_seqs, heads);
        let k_new = rng.f32s(n_seqs * kv_row, -1.0, 1.0);
        let v_new = rng.f32s(n_seqs * kv_row, -1.0, 1.0);

        // The reference: the transformed key and value of each new token in the cache image.
        let positions: Vec<u32> = context_lens.iter().map(|&len| len.saturating_sub(1) as u32).collect();
        let q_heads = test_heads.apply(&q, &positions, false);
        let k_heads = test_heads.apply(&k_new, &positions, true);
        let mut new_slots = Vec::new();
        for (seq, &len) in context_lens.iter().enumerate().filter(|&(_, &len)| len > 0) {
            let slot = cache.slot(seq, len - 1);
            cache.write(slot, &k_heads[seq * kv_row..][..kv_row], &v_new[seq * kv_row..][..kv_row]);
            new_slots.push((seq, slot));
        }
        let group = heads.n_heads / heads.n_kv_heads;
        let mut expected = Vec::with_capacity(q.len());
        for (seq, &len) in context_lens.iter().enumerate() {
            for head in 0..heads.n_heads {
                if len == 0 {
                    expected.extend(std::iter::repeat_n(0.0, heads.head_dim));
                } else {
                    let row = &q_heads[(seq * heads.n_heads + head) * heads.head_dim..][..heads.head_dim];
                    expected.extend(cache.attend(row, seq, len - 1, head / group, &options));
                }
            }
        }

        let lens: Vec<u32> = context_lens.iter().map(|&l| l as u32).collect();
        let context_lens_gpu = Tensor::from_slice(ctx, "context_lens", &[n_seqs], &lens).unwrap();
        let block_table = cache.table_tensor(ctx);
        let q_gpu = Tensor::from_slice(ctx, "q", &[n_seqs, heads.n_heads * heads.head_dim], &q).unwrap();
        let k_new_gpu = Tensor::from_slice(ctx, "k_new", &[n_seqs, kv_row], &k_new).unwrap();
        let v_new_gpu = Tensor::from_slice(ctx, "v_new", &[n_seqs, kv_row], &v_new).unwrap();
        let new = Projections { q: &q_gpu, k: &k_new_gpu, v: &v_new_gpu };
        let out = Tensor::empty(ctx, "out", q_gpu.shape()).unwrap();
        let batch = DecodeBatch { context_lens: &context_lens_gpu, block_table: &block_table };
        let chunked = serial_max_group_heads(decode_group_heads(group), heads.head_dim);
        let variants = [
            DecodeVariant::Workgroups,
            DecodeVariant::Split { key_span: 3 },
            DecodeVariant::Split { key_span: 64 },
            DecodeVariant::Serial { group_heads: 1, kv_textures: false },
            DecodeVariant::Serial { group_heads: chunked, kv_textures: false },
            DecodeVariant::Serial { group_heads: chunked, kv_textures: true },
        ];
        let serial_runs =
            ctx.features().subgroups && ctx.adapter_info().subgroup_min_size >= DECODE_SERIAL_WG;
        for variant in
            variants.into_iter().filter(|v| serial_runs || !matches!(v, DecodeVariant::Serial { .. }))
        {
            let what = format!("{name} {variant:?}");
            out.fill_bits(ctx, POISON);
            let shape = cache.shape();
            let k_cache = Tensor::from_slice(ctx, "k_cache", &shape, &k_before).unwrap();
            let v_cache = Tensor::from_slice(ctx, "v_cache", &shape, &v_before).unwrap();
            let layer = KvCacheLayer::new(&k_cache, &v_cache);
            let mut encoder = ctx.encoder("test");
            decode_as(
                ctx,
                &mut encoder,
                &test_heads.gpu,
                &new,
                &layer,
                &batch,
                &options,
                &out,
                Some(variant),
            )
            .unwrap();
            ctx.submit(encoder).unwrap();
            assert_close(
                &what,
                &pollster::block_on(out.to_f32(ctx)).unwrap(),
                &expected,
                ATTENTION_TOLERANCE,
            );

            // The new keys and values are stored, and nothing else is written.
            let (k_after, v_after) = (read_bits(ctx, &k_cache), read_bits(ctx, &v_cache));
            let (mut k_expected, mut v_expected) = (k_before.clone(), v_before.clone());
            for &(seq, slot) in &new_slots {
                k_expected[slot * kv_row..][..kv_row].copy_from_slice(&k_after[slot * kv_row..][..kv_row]);
                v_expected[slot * kv_row..][..kv_row]
                    .copy_from_slice(bytemuck::cast_slice(&v_new[seq * kv_row..][..kv_row]));
                let stored: &[f32] = bytemuck::cast_slice(&k_after[slot * kv_row..][..kv_row]);
                let tolerance = rope_tolerance(context_lens[seq] as u32) + 2e-6;
                assert_close(
                    &format!("{what}: stored key"),
                    stored,
                    &k_heads[seq * kv_row..][..kv_row],
                    tolerance,
                );
            }
            assert!(k_after == k_expected, "{what}: the K cache changed outside the new tokens' slots");
            assert!(v_after == v_expected, "{what}: the V cache is not the old one with the new values");
        }
    }

    fn read_bits(ctx: &GpuContext, tensor: &Tensor) -> Vec<u32> {
        pollster::block_on(tensor.to_u32(ctx)).unwrap()
    }

    #[test]
    fn decode_one_key_one_sequence() {
        let heads = Heads { head_dim: 64, n_heads: 8, n_kv_heads: 8 };
        check_decode("decode hd64 8/8", heads, 16, &[1], None, None, LLAMA_HEADS);
    }

    #[test]
    fn decode_grouped_heads_several_lengths() {
        let heads = Heads { head_dim: 128, n_heads: 9, n_kv_heads: 3 };
        check_decode("decode hd128 9/3", heads, 16, &[5, 100, 333], None, None, LLAMA_HEADS);
        check_decode("decode hd128 9/3 normed", heads, 16, &[5, 100, 333], None, None, NORMED_HEADS);
    }

    #[test]
    fn decode_sliding_window() {
        let heads = Heads { head_dim: 96, n_heads: 4, n_kv_heads: 1 };
        check_decode("decode hd96 4/1 window", heads, 16, &[333, 17, 1], Some(40), None, NORMED_HEADS);
    }

    #[test]
    fn decode_softcap_odd_block_size_and_empty_context() {
        let heads = Heads { head_dim: 80, n_heads: 9, n_kv_heads: 3 };
        let partial = Transform { rotated_dims: Some(32), ..LLAMA_HEADS };
        check_decode("decode hd80 9/3 softcap", heads, 7, &[100, 0, 17], None, Some(3.0), partial);
    }

    #[test]
    fn decode_head_dim_256_window_and_softcap() {
        let heads = Heads { head_dim: 256, n_heads: 4, n_kv_heads: 1 };
        check_decode("decode hd256 4/1", heads, 16, &[17, 333], Some(100), Some(5.0), NORMED_HEADS);
        let heads = Heads { head_dim: 256, n_heads: 8, n_kv_heads: 8 };
        check_decode("decode hd256 8/8", heads, 32, &[65, 5], None, None, LLAMA_HEADS);
    }

    #[test]
    fn decode_more_grouped_heads_than_one_workgroup_serves() {
        // 12 query heads per kv head: two workgroups of 6 heads each.
        let heads = Heads { head_dim: 64, n_heads: 24, n_kv_heads: 2 };
        check_decode("decode hd64 24/2", heads, 16, &[70, 3], Some(50), None, LLAMA_HEADS);
    }

    #[test]
    fn decode_partial_rotation_and_one_plus_norms() {
        let heads = Heads { head_dim: 12, n_heads: 6, n_kv_heads: 2 };
        let kinds = [
            Transform { layout: RopeLayout::NeoX, rotated_dims: Some(8), norms: Some(NormWeight::OnePlus) },
            Transform {
                layout: RopeLayout::Interleaved,
                rotated_dims: Some(4),
                norms: Some(NormWeight::Scale),
            },
        ];
        for kind in kinds {
            check_decode(&format!("decode hd12 6/2 {kind:?}"), heads, 5, &[9, 1, 40], None, None, kind);
        }
    }

    /// Prints the time of each decode variant this device runs on SmolLM2-135M's and gemma3-270m's
    /// heads at a few context lengths, for 1 and 16 sequences. Not an assertion: run with
    /// `cargo test --release -p flint-core --lib kernels::attention::tests::decode_timing --
    /// --ignored --nocapture`.
    #[test]
    #[ignore = "timing print, run by hand in a release build"]
    fn decode_timing() {
        let ctx = gpu();
        let mut rng = Rng::new("decode timing");
        let models = [
            ("SmolLM2", Heads { head_dim: 64, n_heads: 9, n_kv_heads: 3 }, LLAMA_HEADS),
            ("gemma3", Heads { head_dim: 256, n_heads: 4, n_kv_heads: 1 }, NORMED_HEADS),
        ];
        for (model, heads, transform) in models {
            for (n_seqs, len) in [(1, 64), (1, 256), (1, 1024), (16, 256)] {
                let block_size = 16;
                let mut cache = PagedCache::new(
                    &mut rng,
                    &vec![len; n_seqs],
                    block_size,
                    heads.n_kv_heads,
                    heads.head_dim,
                );
                for seq in 0..n_seqs {
                    cache.fill(&mut rng, seq, len - 1);
                }
                let (k_cache, v_cache) = cache.upload(ctx);
                let layer = KvCacheLayer::new(&k_cache, &v_cache);
                let test_heads = TestHeads::new(ctx, &mut rng, transform, heads.head_dim);
                let kv_row = heads.n_kv_heads * heads.head_dim;
                let q = random_queries(&mut rng, n_seqs, heads);
                let q = Tensor::from_slice(ctx, "q", &[n_seqs, heads.n_heads * heads.head_dim], &q).unwrap();
                let k_new =
                    Tensor::from_slice(ctx, "k", &[n_seqs, kv_row], &rng.f32s(n_seqs * kv_row, -1.0, 1.0))
                        .unwrap();
                let v_new =
                    Tensor::from_slice(ctx, "v", &[n_seqs, kv_row], &rng.f32s(n_seqs * kv_row, -1.0, 1.0))
                        .unwrap();
                let lens = vec![len as u32; n_seqs];
                let context_lens = Tensor::from_slice(ctx, "context_lens", &[n_seqs], &lens).unwrap();
                let block_table = cache.table_tensor(ctx);
                let batch = DecodeBatch { context_lens: &context_lens, block_table: &block_table };
                let new = Projections { q: &q, k: &k_new, v: &v_new };
                let out = Tensor::empty(ctx, "out", q.shape()).unwrap();
                let options = AttentionOptions::new(heads.head_dim);
                let chunk = decode_group_heads(heads.n_heads / heads.n_kv_heads);
                let mut variants = vec![None, Some(DecodeVariant::Workgroups)];
                if ctx.device_class() == DeviceClass::Cpu {
                    for group_heads in (1..=chunk).filter(|d| chunk.is_multiple_of(*d)) {
                        for kv_textures in [false, true] {
                            variants.push(Some(DecodeVariant::Serial { group_heads, kv_textures }));
                        }
                    }
                }
                for variant in variants {
                    let run = |reps: usize| {
                        let mut encoder = ctx.encoder("timing");
                        for _ in 0..reps {
                            decode_as(
                                ctx,
                                &mut encoder,
                                &test_heads.gpu,
                                &new,
                                &layer,
                                &batch,
                                &options,
                                &out,
                                variant,
                            )
                            .unwrap();
                        }
                        ctx.submit(encoder).unwrap();
                        pollster::block_on(out.to_f32(ctx)).unwrap();
                    };
                    run(1);
                    let reps = 10;
                    let start = std::time::Instant::now();
                    run(reps);
                    let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
                    let name = variant.map_or("chosen".to_string(), |v| format!("{v:?}"));
                    eprintln!("{model} {n_seqs} x {len} keys: {ms:.3} ms, {name}");
                }
            }
        }
    }

    /// Prints the time of the prefill variants this device runs on a 256-token prompt of
    /// SmolLM2-135M's and gemma3-270m's heads (after a warm-up, min of 5 alternating submissions
    /// of 4 prefills each). Not an assertion: run
    /// with `cargo test --release -p flint-core --lib kernels::attention::tests::prefill_timing --
    /// --ignored --nocapture`.
    #[test]
    #[ignore = "timing print, run by hand in a release build"]
    fn prefill_timing() {
        let ctx = gpu();
        let mut rng = Rng::new("prefill timing");
        let models = [
            ("SmolLM2", Heads { head_dim: 64, n_heads: 9, n_kv_heads: 3 }),
            ("gemma3", Heads { head_dim: 256, n_heads: 4, n_kv_heads: 1 }),
        ];
        let len = 256;
        for (model, heads) in models {
            let mut cache = PagedCache::new(&mut rng, &[len], 16, heads.n_kv_heads, heads.head_dim);
            cache.fill(&mut rng, 0, len);
            let (k, v) = cache.upload(ctx);
            let layer = KvCacheLayer::new(&k, &v);
            let shape = [len, heads.n_heads * heads.head_dim];
            let q = Tensor::from_slice(ctx, "q", &shape, &random_queries(&mut rng, len, heads)).unwrap();
            let out = Tensor::empty(ctx, "out", &shape).unwrap();
            let seq_ids = Tensor::from_slice(ctx, "seq_ids", &[len], &vec![0u32; len]).unwrap();
            let positions: Vec<u32> = (0..len as u32).collect();
            let positions = Tensor::from_slice(ctx, "positions", &[len], &positions).unwrap();
            let block_table = cache.table_tensor(ctx);
            let batch = PrefillBatch { seq_ids: &seq_ids, positions: &positions, block_table: &block_table };
            let options = AttentionOptions::new(heads.head_dim);
            let chunk = decode_group_heads(heads.n_heads / heads.n_kv_heads);
            let mut cases: Vec<(Option<PrefillVariant>, f64)> = vec![(None, f64::MAX)];
            if ctx.device_class() == DeviceClass::Cpu {
                for group_heads in (1..=chunk).filter(|d| chunk.is_multiple_of(*d)) {
                    for rows in [1, 2, 4, 8, 16] {
                        let variant = PrefillVariant::Serial { group_heads, rows, kv_textures: true };
                        cases.push((Some(variant), f64::MAX));
                    }
                }
            }
            let run = |variant: Option<PrefillVariant>, reps: usize| {
                let mut encoder = ctx.encoder("timing");
                for _ in 0..reps {
                    prefill_as(ctx, &mut encoder, &q, &layer, &batch, &options, &out, variant).unwrap();
                }
                ctx.submit(encoder).unwrap();
                pollster::block_on(out.to_f32(ctx)).unwrap();
            };
            for (variant, _) in &cases {
                run(*variant, 1);
            }
            for _ in 0..5 {
                for (variant, best) in &mut cases {
                    let start = std::time::Instant::now();
                    run(*variant, 4);
                    *best = best.min(start.elapsed().as_secs_f64() * 1e3 / 4.0);
                }
            }
            for (variant, ms) in cases {
                let name = variant.map_or("chosen".to_string(), |v| format!("{v:?}"));
                eprintln!("{model} {len} tokens: {ms:.2} ms, {name}");
            }
        }
    }

    #[test]
    fn decode_group_heads_divide_the_group() {
        let cases = [(1, 1), (3, 3), (8, 8), (9, 3), (12, 6), (16, 8), (48, 8), (11, 1)];
        for (group, heads) in cases {
            assert_eq!(decode_group_heads(group), heads, "group of {group}");
        }
    }

    /// How the tokens of a prefill batch are laid out.
    #[derive(Clone, Copy, PartialEq)]
    enum TokenOrder {
        /// Sequence by sequence, positions increasing: what the engine sends.
        Grouped,
        /// Shuffled, with padding tokens (seq id `u32::MAX`) mixed in.
        ShuffledWithPadding,
    }

    /// Prefill of `chunks` (per sequence: tokens already cached, new tokens), whose new keys and
    /// values are written with [`store_kv`] in the same command buffer, as a step does.
    fn check_prefill(
        name: &str,
        heads: Heads,
        block_size: usize,
        chunks: &[(usize, usize)],
        sliding_window: Option<u32>,
        softcap: Option<f32>,
        order: TokenOrder,
    ) {
        let ctx = gpu();
        let mut rng = Rng::new(name);
        let capacities: Vec<usize> = chunks.iter().map(|&(cached, new)| cached + new).collect();
        let mut cache = PagedCache::new(&mut rng, &capacities, block_size, heads.n_kv_heads, heads.head_dim);
        for (seq, &(cached, _)) in chunks.iter().enumerate() {
            cache.fill(&mut rng, seq, cached);
        }
        let (k, v) = cache.upload(ctx);
        let options = options(&mut rng, heads, sliding_window, softcap);

        // (seq id, position) of each query token; the new tokens' K/V go into the CPU image only
        // after the upload, so the GPU cache has them only if store_kv works.
        let mut tokens: Vec<(u32, usize)> = chunks
            .iter()
            .enumerate()
            .flat_map(|(seq, &(cached, new))| (cached..cached + new).map(move |p| (seq as u32, p)))
            .collect();
        if order == TokenOrder::ShuffledWithPadding {
            tokens.extend([(u32::MAX, 0), (u32::MAX, 3)]);
            for i in (1..tokens.len()).rev() {
                tokens.swap(i, rng.usize(0, i + 1));
            }
        }
        let n_tokens = tokens.len();
        let row = heads.n_kv_heads * heads.head_dim;
        let (mut k_new, mut v_new, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for &(seq, position) in &tokens {
            let (k_row, v_row) = cache.random_row(&mut rng);
            let slot = if seq == u32::MAX {
                u32::MAX
            } else {
                let slot = cache.slot(seq as usize, position);
                cache.write(slot, &k_row, &v_row);
                slot as u32
            };
            k_new.extend(k_row);
            v_new.extend(v_row);
            slots.push(slot);
        }
        let q = random_queries(&mut rng, n_tokens, heads);

        let k_new_gpu = Tensor::from_slice(ctx, "k_new", &[n_tokens, row], &k_new).unwrap();
        let v_new_gpu = Tensor::from_slice(ctx, "v_new", &[n_tokens, row], &v_new).unwrap();
        let slots_gpu = Tensor::from_slice(ctx, "slots", &[n_tokens], &slots).unwrap();
        let seq_ids: Vec<u32> = tokens.iter().map(|&(s, _)| s).collect();
        let positions: Vec<u32> = tokens.iter().map(|&(_, p)| p as u32).collect();
        let seq_ids_gpu = Tensor::from_slice(ctx, "seq_ids", &[n_tokens], &seq_ids).unwrap();
        let positions_gpu = Tensor::from_slice(ctx, "positions", &[n_tokens], &positions).unwrap();
        let block_table = cache.table_tensor(ctx);
        // q as the projection writes it: [n_tokens, n_heads * head_dim].
        let shape = [n_tokens, heads.n_heads * heads.head_dim];
        let q_gpu = Tensor::from_slice(ctx, "q", &shape, &q).unwrap();
        let out = Tensor::empty(ctx, "out", &shape).unwrap();
        out.fill_bits(ctx, POISON);

        let layer = KvCacheLayer::new(&k, &v);
        let mut encoder = ctx.encoder("test");
        store_kv(ctx, &mut encoder, &layer, &k_new_gpu, &v_new_gpu, &slots_gpu).unwrap();
        let batch =
            PrefillBatch { seq_ids: &seq_ids_gpu, positions: &positions_gpu, block_table: &block_table };
        ctx.submit(encoder).unwrap();

        let group = heads.n_heads / heads.n_kv_heads;
        let mut expected = Vec::with_capacity(q.len());
        for (t, &(seq, position)) in tokens.iter().enumerate() {
            for head in 0..heads.n_heads {
                if seq == u32::MAX {
                    expected.extend(std::iter::repeat_n(0.0, heads.head_dim));
                } else {
                    let row = &q[(t * heads.n_heads + head) * heads.head_dim..][..heads.head_dim];
                    expected.extend(cache.attend(row, seq as usize, position, head / group, &options));
                }
            }
        }
        let chunk = decode_group_heads(group);
        let largest = serial_max_group_heads(chunk, heads.head_dim);
        let mut variants = vec![PrefillVariant::Workgroups];
        if ctx.features().subgroups && ctx.adapter_info().subgroup_min_size >= DECODE_SERIAL_WG {
            variants.extend([
                PrefillVariant::Serial { group_heads: 1, rows: 1, kv_textures: false },
                PrefillVariant::Serial { group_heads: largest, rows: 3, kv_textures: false },
                PrefillVariant::Serial { group_heads: largest, rows: 3, kv_textures: true },
                tuning::prefill_variant(ctx, chunk, heads.head_dim),
            ]);
        }
        for variant in variants {
            out.fill_bits(ctx, POISON);
            let mut encoder = ctx.encoder("test");
            prefill_as(ctx, &mut encoder, &q_gpu, &layer, &batch, &options, &out, Some(variant)).unwrap();
            ctx.submit(encoder).unwrap();
            let got = pollster::block_on(out.to_f32(ctx)).unwrap();
            assert_close(&format!("{name} {variant:?}"), &got, &expected, ATTENTION_TOLERANCE);
        }
    }

    #[test]
    fn prefill_single_token() {
        let heads = Heads { head_dim: 64, n_heads: 8, n_kv_heads: 8 };
        check_prefill("prefill hd64 8/8 one token", heads, 16, &[(0, 1)], None, None, TokenOrder::Grouped);
    }

    #[test]
    fn prefill_several_whole_prompts() {
        let heads = Heads { head_dim: 80, n_heads: 9, n_kv_heads: 3 };
        let prompts = [(0, 5), (0, 17), (0, 40)];
        check_prefill("prefill hd80 9/3 prompts", heads, 16, &prompts, None, None, TokenOrder::Grouped);
    }

    #[test]
    fn prefill_chunks_after_cached_tokens_window_softcap() {
        let heads = Heads { head_dim: 128, n_heads: 4, n_kv_heads: 1 };
        let chunks = [(100, 33), (0, 7)];
        check_prefill(
            "prefill hd128 4/1 chunks",
            heads,
            16,
            &chunks,
            Some(50),
            Some(3.0),
            TokenOrder::Grouped,
        );
    }

    #[test]
    fn prefill_shuffled_tokens_with_padding() {
        let heads = Heads { head_dim: 96, n_heads: 9, n_kv_heads: 3 };
        let chunks = [(17, 20), (3, 1), (0, 30)];
        let order = TokenOrder::ShuffledWithPadding;
        check_prefill("prefill hd96 9/3 shuffled", heads, 5, &chunks, Some(16), None, order);
    }

    #[test]
    fn prefill_head_dim_256_long_prompt() {
        let heads = Heads { head_dim: 256, n_heads: 4, n_kv_heads: 1 };
        check_prefill("prefill hd256 4/1", heads, 16, &[(0, 333)], None, Some(5.0), TokenOrder::Grouped);
        let heads = Heads { head_dim: 256, n_heads: 8, n_kv_heads: 8 };
        check_prefill(
            "prefill hd256 8/8",
            heads,
            16,
            &[(60, 21), (0, 2)],
            Some(30),
            None,
            TokenOrder::Grouped,
        );
    }

    /// The fused pass gives bit for bit what rope, rope and store_kv give, for both layouts,
    /// whole and partial rotation, padding slots included.
    #[test]
    fn rope_and_store_kv_equals_its_three_passes() {
        use crate::kernels::rope::rope;
        let ctx = gpu();
        let mut rng = Rng::new("rope_kv");
        let (num_blocks, block_size, n_kv_heads, q_heads) = (3, 16, 3, 7);
        for (layout, head_dim, rotated_dims) in [
            (RopeLayout::Interleaved, 64, 64),
            (RopeLayout::NeoX, 80, 80),
            (RopeLayout::NeoX, 80, 32),
            (RopeLayout::Interleaved, 12, 8),
        ] {
            let rotary = Rope::new(ctx, &rope_config(head_dim, rotated_dims, layout)).unwrap();
            let row = n_kv_heads * head_dim;
            let n_slots = num_blocks * block_size;
            let mut slots: Vec<u32> = (0..n_slots as u32).rev().step_by(3).collect();
            slots.insert(2, u32::MAX);
            let n_tokens = slots.len();
            let positions: Vec<u32> = (0..n_tokens as u32).map(|t| 3 * t + 1000).collect();
            let q = rng.f32s(n_tokens * q_heads * head_dim, -1.0, 1.0);
            let k = rng.f32s(n_tokens * row, -1.0, 1.0);
            let v = rng.f32s(n_tokens * row, -1.0, 1.0);
            let before = rng.f32s(n_slots * row, -1.0, 1.0);
            let shape = [num_blocks, block_size, n_kv_heads, head_dim];
            let run = |fused: bool| {
                let q = Tensor::from_slice(ctx, "q", &[n_tokens, q_heads * head_dim], &q).unwrap();
                let k = Tensor::from_slice(ctx, "k", &[n_tokens, row], &k).unwrap();
                let v = Tensor::from_slice(ctx, "v", &[n_tokens, row], &v).unwrap();
                let positions = Tensor::from_slice(ctx, "positions", &[n_tokens], &positions).unwrap();
                let slots = Tensor::from_slice(ctx, "slots", &[n_tokens], &slots).unwrap();
                let k_cache = Tensor::from_slice(ctx, "k_cache", &shape, &before).unwrap();
                let v_cache = Tensor::from_slice(ctx, "v_cache", &shape, &before).unwrap();
                let cache = KvCacheLayer::new(&k_cache, &v_cache);
                let mut encoder = ctx.encoder("test");
                if fused {
                    rope_and_store_kv(ctx, &mut encoder, &rotary, &q, &k, &v, &positions, &cache, &slots)
                        .unwrap();
                } else {
                    rope(ctx, &mut encoder, &rotary, &q, &positions).unwrap();
                    rope(ctx, &mut encoder, &rotary, &k, &positions).unwrap();
                    store_kv(ctx, &mut encoder, &cache, &k, &v, &slots).unwrap();
                }
                ctx.submit(encoder).unwrap();
                let read = |t: &Tensor| pollster::block_on(t.to_f32(ctx)).unwrap();
                (read(&q), read(&k_cache), read(&v_cache))
            };
            let (fused, separate) = (run(true), run(false));
            let what = format!("{layout:?}, {rotated_dims} of {head_dim} dims rotated");
            assert_ne!(separate.0, q, "{what}: the rotation changes q");
            assert_eq!(fused.0, separate.0, "{what}: q");
            assert_eq!(fused.1, separate.1, "{what}: K cache");
            assert_eq!(fused.2, separate.2, "{what}: V cache");
        }
    }

    #[test]
    fn store_kv_writes_shuffled_slots_and_nothing_else() {
        let ctx = gpu();
        let mut rng = Rng::new("store_kv");
        let (num_blocks, block_size, n_kv_heads, head_dim) = (5, 16, 3, 80);
        let row = n_kv_heads * head_dim;
        let n_slots = num_blocks * block_size;
        let before_k = rng.f32s(n_slots * row, -1.0, 1.0);
        let before_v = rng.f32s(n_slots * row, -1.0, 1.0);
        // 37 distinct shuffled slots, then tokens past the cache that must not be stored: padding,
        // the first slot past the end, and one whose element index wraps around u32 into the cache.
        let mut order: Vec<u32> = (0..n_slots as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.usize(0, i + 1));
        }
        let mut slots = order[..37].to_vec();
        let wrapping_slot = (1u64 << 32).div_ceil(row as u64 / 4) as u32;
        slots.extend([u32::MAX, n_slots as u32, wrapping_slot]);
        let n_tokens = slots.len();
        let k_new = rng.f32s(n_tokens * row, -1.0, 1.0);
        let v_new = rng.f32s(n_tokens * row, -1.0, 1.0);

        let shape = [num_blocks, block_size, n_kv_heads, head_dim];
        let k = Tensor::from_slice(ctx, "k_cache", &shape, &before_k).unwrap();
        let v = Tensor::from_slice(ctx, "v_cache", &shape, &before_v).unwrap();
        let k_new_gpu = Tensor::from_slice(ctx, "k_new", &[n_tokens, row], &k_new).unwrap();
        let v_new_gpu = Tensor::from_slice(ctx, "v_new", &[n_tokens, row], &v_new).unwrap();
        let slots_gpu = Tensor::from_slice(ctx, "slots", &[n_tokens], &slots).unwrap();
        let mut encoder = ctx.encoder("test");
        store_kv(ctx, &mut encoder, &KvCacheLayer::new(&k, &v), &k_new_gpu, &v_new_gpu, &slots_gpu).unwrap();
        ctx.submit(encoder).unwrap();

        let (mut expected_k, mut expected_v) = (before_k, before_v);
        for (t, &slot) in slots.iter().enumerate().filter(|&(_, &s)| (s as usize) < n_slots) {
            let slot = slot as usize;
            expected_k[slot * row..][..row].copy_from_slice(&k_new[t * row..][..row]);
            expected_v[slot * row..][..row].copy_from_slice(&v_new[t * row..][..row]);
        }
        assert_eq!(pollster::block_on(k.to_f32(ctx)).unwrap(), expected_k, "K cache");
        assert_eq!(pollster::block_on(v.to_f32(ctx)).unwrap(), expected_v, "V cache");
    }

    #[test]
    fn every_head_dim_variant_validates_and_fits_16_kib() {
        let workgroup_bytes = |source: &KernelSource| {
            let module = naga::front::wgsl::parse_str(&source.wgsl()).unwrap();
            module
                .global_variables
                .iter()
                .filter(|(_, var)| var.space == naga::AddressSpace::WorkGroup)
                .map(|(_, var)| module.types[var.ty].inner.size(module.to_ctx()) as usize)
                .sum::<usize>()
        };
        validate_wgsl(&KernelSource::new("kv_store", &[KV_STORE]).define("WG", format!("{KV_STORE_WG}u")));
        let ctx = gpu();
        for head_dim in (4..=MAX_HEAD_DIM).step_by(4) {
            let weight = vec![1.0f32; head_dim];
            let norms = HeadNorms { q: &weight, k: &weight, convention: NormWeight::Scale, eps: 1e-6 };
            // Llama's kind, and the normed kind with half the dims rotated.
            let transforms = [
                HeadTransform::new(ctx, &rope_config(head_dim, head_dim, RopeLayout::Interleaved), None),
                HeadTransform::new(ctx, &rope_config(head_dim, head_dim / 2, RopeLayout::NeoX), Some(norms)),
            ]
            .map(Result::unwrap);
            let mut sources = vec![prefill_source(head_dim, PrefillVariant::Workgroups)];
            for group_heads in (1..=DECODE_MAX_GROUP_HEADS).filter(|g| g * head_dim <= SERIAL_MAX_HEAD_VALUES)
            {
                for kv_textures in [false, true] {
                    let serial = PrefillVariant::Serial { group_heads, rows: 1, kv_textures };
                    sources.push(prefill_source(head_dim, serial).define("KV_TEXTURES", kv_textures));
                }
            }
            for heads in &transforms {
                for group_heads in 1..=DECODE_MAX_GROUP_HEADS {
                    sources.push(decode_source(heads, group_heads, DecodeVariant::Workgroups));
                    sources.push(decode_source(heads, group_heads, DecodeVariant::Split { key_span: 64 }));
                    sources.push(combine_source(head_dim, group_heads));
                    if group_heads * head_dim <= SERIAL_MAX_HEAD_VALUES {
                        for kv_textures in [false, true] {
                            let serial = DecodeVariant::Serial { group_heads, kv_textures };
                            sources.push(
                                decode_source(heads, group_heads, serial).define("KV_TEXTURES", kv_textures),
                            );
                        }
                    }
                }
            }
            for source in &sources {
                validate_wgsl(source);
                let bytes = workgroup_bytes(source);
                assert!(bytes <= WORKGROUP_BYTES, "{} {:?}: {bytes} bytes", source.entry, source.defines);
            }
        }
    }

    #[test]
    fn mismatched_arguments_are_errors() {
        let ctx = gpu();
        let tensor = |shape: &[usize]| Tensor::empty(ctx, "t", shape).unwrap();
        let (k, v) = (tensor(&[4, 16, 2, 64]), tensor(&[4, 16, 2, 64]));
        let cache = KvCacheLayer::new(&k, &v);
        let (lens, table) = (tensor(&[3]), tensor(&[3, 4]));
        let batch = DecodeBatch { context_lens: &lens, block_table: &table };
        let options = AttentionOptions::new(64);
        let rope = rope_config(64, 64, RopeLayout::NeoX);
        let heads = HeadTransform::new(ctx, &rope, None).unwrap();
        let kv_new = tensor(&[3, 2 * 64]);
        let mut encoder = ctx.encoder("test");
        let mut decode_err = |heads: &HeadTransform, q: &Tensor, kv: &Tensor, cache, batch, options| {
            let new = Projections { q, k: kv, v: kv };
            decode(ctx, &mut encoder, heads, &new, cache, batch, options, q).unwrap_err().to_string()
        };

        let q = tensor(&[3, 4, 64]);
        // 5 query heads over 2 kv heads.
        let err = decode_err(&heads, &tensor(&[3, 5, 64]), &kv_new, &cache, &batch, &options);
        assert!(err.contains("attention_decode") && err.contains("kv heads"), "{err}");
        // q rows do not match the sequences.
        let err = decode_err(&heads, &tensor(&[2, 4, 64]), &kv_new, &cache, &batch, &options);
        assert!(err.contains("query rows"), "{err}");
        // Keys and values of one kv head, for a cache of two.
        let err = decode_err(&heads, &q, &tensor(&[3, 64]), &cache, &batch, &options);
        assert!(err.contains("k has 192"), "{err}");
        // A transform of other heads.
        let heads_32 =
            HeadTransform::new(ctx, &RopeConfig { head_dim: 32, rotated_dims: 32, ..rope }, None).unwrap();
        let err = decode_err(&heads_32, &q, &kv_new, &cache, &batch, &options);
        assert!(err.contains("heads of 32"), "{err}");
        // A head size past the limit.
        let (k_big, v_big) = (tensor(&[1, 4, 1, 260]), tensor(&[1, 4, 1, 260]));
        let big = KvCacheLayer::new(&k_big, &v_big);
        let err = decode_err(&heads, &tensor(&[3, 1, 260]), &kv_new, &big, &batch, &options);
        assert!(err.contains("head_dim 260"), "{err}");
        // K and V of different shapes.
        let mismatched = KvCacheLayer::new(&k, &k_big);
        let err = decode_err(&heads, &q, &kv_new, &mismatched, &batch, &options);
        assert!(err.contains("num_blocks"), "{err}");
        // A block table with rows for other sequences.
        let short_table = tensor(&[2, 4]);
        let short = DecodeBatch { context_lens: &lens, block_table: &short_table };
        let err = decode_err(&heads, &q, &kv_new, &cache, &short, &options);
        assert!(err.contains("2 rows for 3 sequences"), "{err}");
        // Options out of range.
        let zero_window = AttentionOptions { sliding_window: Some(0), ..options };
        assert!(decode_err(&heads, &q, &kv_new, &cache, &batch, &zero_window).contains("sliding window"));
        let bad_cap = AttentionOptions { softcap: Some(-1.0), ..options };
        assert!(decode_err(&heads, &q, &kv_new, &cache, &batch, &bad_cap).contains("softcap"));
        // Norm weights of another head size.
        let weight = [1.0f32; 60];
        let norms = HeadNorms { q: &weight, k: &weight, convention: NormWeight::Scale, eps: 1e-6 };
        let err = HeadTransform::new(ctx, &rope, Some(norms)).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("heads have 64"), "{err}");

        let (seq_ids, positions) = (tensor(&[7]), tensor(&[6]));
        let batch = PrefillBatch { seq_ids: &seq_ids, positions: &positions, block_table: &table };
        let q = tensor(&[7, 4 * 64]);
        let err = prefill(ctx, &mut encoder, &q, &cache, &batch, &options, &q).unwrap_err().to_string();
        assert!(err.contains("attention_prefill") && err.contains("6 positions"), "{err}");

        let (k_new, slots) = (tensor(&[5, 2 * 64]), tensor(&[4]));
        let err = store_kv(ctx, &mut encoder, &cache, &k_new, &k_new, &slots).unwrap_err().to_string();
        assert!(err.contains("kv_store"), "{err}");
    }
}
