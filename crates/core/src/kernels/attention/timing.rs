//! Timings of the attention variants on real model heads, which the attention rows of
//! `tuning.rs` are set from: run by `crates/core/benches/kernels.rs` (`cargo bench -p flint-core
//! --features kernel-timing --bench kernels -- attention`), printed, never asserted.

use super::*;
use crate::gpu::DeviceClass;
use crate::kernels::rope::RopeLayout;
use crate::kernels::testing::{Rng, gpu};

/// A model's attention heads as the timings run them.
struct ModelHeads {
    model: &'static str,
    head_dim: usize,
    n_heads: usize,
    n_kv_heads: usize,
    layout: RopeLayout,
    /// Per-head q and k norms (Gemma 3, Qwen 3), or none (Llama).
    normed: bool,
}

const SMOLLM2: ModelHeads = ModelHeads {
    model: "SmolLM2",
    head_dim: 64,
    n_heads: 9,
    n_kv_heads: 3,
    layout: RopeLayout::Interleaved,
    normed: false,
};

const GEMMA3: ModelHeads = ModelHeads {
    model: "gemma3",
    head_dim: 256,
    n_heads: 4,
    n_kv_heads: 1,
    layout: RopeLayout::NeoX,
    normed: true,
};

const BLOCK_SIZE: usize = 16;

/// A paged cache of random keys and values with room for `n_seqs` sequences of `len` tokens,
/// each given consecutive blocks, and its block table.
struct RandomCache {
    k: Tensor,
    v: Tensor,
    block_table: Tensor,
}

impl RandomCache {
    fn new(ctx: &GpuContext, rng: &mut Rng, heads: &ModelHeads, n_seqs: usize, len: usize) -> Result<Self> {
        let blocks_per_seq = len.div_ceil(BLOCK_SIZE);
        // Words of two f16.
        let shape = [n_seqs * blocks_per_seq, BLOCK_SIZE, heads.n_kv_heads, heads.head_dim / 2];
        let elements = shape.iter().product::<usize>() * 2;
        let table: Vec<u32> = (0..(n_seqs * blocks_per_seq) as u32).collect();
        Ok(RandomCache {
            k: Tensor::from_slice(ctx, "k_cache", &shape, &pack_halves(&rng.f32s(elements, -1.0, 1.0)))?,
            v: Tensor::from_slice(ctx, "v_cache", &shape, &pack_halves(&rng.f32s(elements, -1.0, 1.0)))?,
            block_table: Tensor::from_slice(ctx, "block_table", &[n_seqs, blocks_per_seq], &table)?,
        })
    }
}

/// Queries of `rows` tokens, spread wider than the keys as real ones are.
fn random_queries(ctx: &GpuContext, rng: &mut Rng, heads: &ModelHeads, rows: usize) -> Result<Tensor> {
    let width = heads.n_heads * heads.head_dim;
    Tensor::from_slice(ctx, "q", &[rows, width], &rng.f32s(rows * width, -6.0, 6.0))
}

/// Prints the wall time of each decode variant this device runs on SmolLM2-135M's and
/// gemma3-270m's heads at a few context lengths, for 1 and 16 sequences (10 steps after one
/// of warm-up).
pub fn decode() -> Result<()> {
    let ctx = gpu();
    let mut rng = Rng::new("decode timing");
    for heads in [SMOLLM2, GEMMA3] {
        let norm_weights = rng.f32s(2 * heads.head_dim, -2.0, 2.0);
        let (q_norm, k_norm) = norm_weights.split_at(heads.head_dim);
        let rope = RopeConfig {
            head_dim: heads.head_dim,
            rotated_dims: heads.head_dim,
            base: 10_000.0,
            freq_scale: 1.0,
            layout: heads.layout,
            freq_factors: None,
        };
        let norms = heads.normed.then_some(HeadNorms {
            q: q_norm,
            k: k_norm,
            convention: NormWeight::Scale,
            eps: 1e-6,
        });
        let transform = HeadTransform::new(ctx, &rope, norms)?;
        for (n_seqs, len) in [(1, 64), (1, 256), (1, 1024), (16, 256)] {
            let cache = RandomCache::new(ctx, &mut rng, &heads, n_seqs, len)?;
            let layer = KvCacheLayer::new(&cache.k, &cache.v);
            let kv_row = heads.n_kv_heads * heads.head_dim;
            let q = random_queries(ctx, &mut rng, &heads, n_seqs)?;
            let k_new =
                Tensor::from_slice(ctx, "k", &[n_seqs, kv_row], &rng.f32s(n_seqs * kv_row, -1.0, 1.0))?;
            let v_new =
                Tensor::from_slice(ctx, "v", &[n_seqs, kv_row], &rng.f32s(n_seqs * kv_row, -1.0, 1.0))?;
            let context_lens = Tensor::from_slice(ctx, "context_lens", &[n_seqs], &vec![len as u32; n_seqs])?;
            let batch = DecodeBatch { context_lens: &context_lens, block_table: &cache.block_table };
            let new = Projections { q: &q, k: &k_new, v: &v_new };
            let out = Tensor::empty(ctx, "out", q.shape())?;
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
                let run = |reps: usize| -> Result<()> {
                    let mut encoder = ctx.encoder("timing");
                    for _ in 0..reps {
                        decode_as(
                            ctx,
                            &mut encoder,
                            &transform,
                            &new,
                            &layer,
                            &batch,
                            &options,
                            &out,
                            variant,
                        )?;
                    }
                    ctx.submit(encoder)?;
                    pollster::block_on(out.to_f32(ctx))?;
                    Ok(())
                };
                run(1)?;
                let reps = 10;
                let start = std::time::Instant::now();
                run(reps)?;
                let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
                let name = variant.map_or("chosen".to_string(), |v| format!("{v:?}"));
                println!("{} {n_seqs} x {len} keys: {ms:.3} ms, {name}", heads.model);
            }
        }
    }
    Ok(())
}

/// Prints the wall time of the prefill variants this device runs on a 256-token prompt of
/// SmolLM2-135M's and gemma3-270m's heads (after a warm-up, min of 5 alternating submissions
/// of 4 prefills each).
pub fn prefill() -> Result<()> {
    let ctx = gpu();
    let mut rng = Rng::new("prefill timing");
    let len = 256;
    for heads in [SMOLLM2, GEMMA3] {
        let cache = RandomCache::new(ctx, &mut rng, &heads, 1, len)?;
        let layer = KvCacheLayer::new(&cache.k, &cache.v);
        let q = random_queries(ctx, &mut rng, &heads, len)?;
        let out = Tensor::empty(ctx, "out", q.shape())?;
        let seq_ids = Tensor::from_slice(ctx, "seq_ids", &[len], &vec![0u32; len])?;
        let positions: Vec<u32> = (0..len as u32).collect();
        let positions = Tensor::from_slice(ctx, "positions", &[len], &positions)?;
        let batch =
            PrefillBatch { seq_ids: &seq_ids, positions: &positions, block_table: &cache.block_table };
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
        let run = |variant: Option<PrefillVariant>, reps: usize| -> Result<()> {
            let mut encoder = ctx.encoder("timing");
            for _ in 0..reps {
                prefill_as(ctx, &mut encoder, &q, &layer, &batch, &options, &out, variant)?;
            }
            ctx.submit(encoder)?;
            pollster::block_on(out.to_f32(ctx))?;
            Ok(())
        };
        for (variant, _) in &cases {
            run(*variant, 1)?;
        }
        for _ in 0..5 {
            for (variant, best) in &mut cases {
                let start = std::time::Instant::now();
                run(*variant, 4)?;
                *best = best.min(start.elapsed().as_secs_f64() * 1e3 / 4.0);
            }
        }
        for (variant, ms) in cases {
            let name = variant.map_or("chosen".to_string(), |v| format!("{v:?}"));
            println!("{} {len} tokens: {ms:.2} ms, {name}", heads.model);
        }
    }
    Ok(())
}
