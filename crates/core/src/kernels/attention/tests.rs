use super::*;
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

/// Bound on an f16 element's rounding, relative: half an f16 ulp.
const F16_ROUNDING: f32 = 4.9e-4;

/// A CPU image of one layer's paged cache (its values rounded to f16 as the GPU cache holds
/// them), and the block table row of each sequence.
#[derive(Clone)]
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
        self.tables[seq][position / self.block_size] as usize * self.block_size + position % self.block_size
    }

    /// Random keys and values (each `[n_kv_heads * head_dim]`) for one token.
    fn random_row(&self, rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
        let row = self.n_kv_heads * self.head_dim;
        (rng.f32s(row, -1.0, 1.0), rng.f32s(row, -1.0, 1.0))
    }

    /// Stores `k` and `v` in `slot`, rounded to f16.
    fn write(&mut self, slot: usize, k: &[f32], v: &[f32]) {
        let row = self.n_kv_heads * self.head_dim;
        self.k[slot * row..(slot + 1) * row].copy_from_slice(&as_cached(k));
        self.v[slot * row..(slot + 1) * row].copy_from_slice(&as_cached(v));
    }

    /// Fills positions `0 .. len` of sequence `seq` with random keys and values.
    fn fill(&mut self, rng: &mut Rng, seq: usize, len: usize) {
        for position in 0..len {
            let (k, v) = self.random_row(rng);
            self.write(self.slot(seq, position), &k, &v);
        }
    }

    /// The shape of the cache's tensors, in words of two f16.
    fn shape(&self) -> [usize; 4] {
        [self.num_blocks, self.block_size, self.n_kv_heads, self.head_dim / 2]
    }

    fn upload(&self, ctx: &GpuContext) -> (Tensor, Tensor) {
        (
            Tensor::from_slice(ctx, "k_cache", &self.shape(), &pack_halves(&self.k)).unwrap(),
            Tensor::from_slice(ctx, "v_cache", &self.shape(), &pack_halves(&self.v)).unwrap(),
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

/// `x` as the cache keeps it.
fn as_cached(x: &[f32]) -> Vec<f32> {
    unpack_halves(&pack_halves(x))
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
const LLAMA_HEADS: Transform = Transform { layout: RopeLayout::Interleaved, rotated_dims: None, norms: None };
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
            (rng.f32s(head_dim, -2.0, 2.0), rng.f32s(head_dim, -2.0, 2.0), convention, rng.f32(1e-6, 1e-4))
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
            Some((q, k, convention, eps)) => norm_reference(x, if is_key { k } else { q }, *convention, *eps),
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

    // The reference: the transformed queries and keys. Each run's attention is checked against
    // the cache image holding the key it stored: an f16 rounding of the GPU's f32 transform may
    // differ by an ulp from that of the CPU's, which moves the scores by more than the bound.
    let positions: Vec<u32> = context_lens.iter().map(|&len| len.saturating_sub(1) as u32).collect();
    let q_heads = test_heads.apply(&q, &positions, false);
    let k_heads = test_heads.apply(&k_new, &positions, true);
    let new_slots: Vec<(usize, usize)> = (context_lens.iter().enumerate())
        .filter(|&(_, &len)| len > 0)
        .map(|(seq, &len)| (seq, cache.slot(seq, len - 1)))
        .collect();
    let group = heads.n_heads / heads.n_kv_heads;
    let expected_with = |image: &PagedCache| {
        let mut expected = Vec::with_capacity(q.len());
        for (seq, &len) in context_lens.iter().enumerate() {
            for head in 0..heads.n_heads {
                if len == 0 {
                    expected.extend(std::iter::repeat_n(0.0, heads.head_dim));
                } else {
                    let row = &q_heads[(seq * heads.n_heads + head) * heads.head_dim..][..heads.head_dim];
                    expected.extend(image.attend(row, seq, len - 1, head / group, &options));
                }
            }
        }
        expected
    };

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
    let serial_runs = ctx.features().subgroups && ctx.adapter_info().subgroup_min_size >= DECODE_SERIAL_WG;
    for variant in variants.into_iter().filter(|v| serial_runs || !matches!(v, DecodeVariant::Serial { .. }))
    {
        let what = format!("{name} {variant:?}");
        out.fill_bits(ctx, POISON);
        let shape = cache.shape();
        let k_cache = Tensor::from_slice(ctx, "k_cache", &shape, &k_before).unwrap();
        let v_cache = Tensor::from_slice(ctx, "v_cache", &shape, &v_before).unwrap();
        let layer = KvCacheLayer::new(&k_cache, &v_cache);
        let mut encoder = ctx.encoder("test");
        decode_as(ctx, &mut encoder, &test_heads.gpu, &new, &layer, &batch, &options, &out, Some(variant))
            .unwrap();
        ctx.submit(encoder).unwrap();

        // The new keys and values are stored (the values rounded to nearest f16, the keys within
        // the rope's bound and an f16 rounding), and nothing else is written.
        let (k_after, v_after) = (read_bits(ctx, &k_cache), read_bits(ctx, &v_cache));
        let (mut k_expected, mut v_expected) = (k_before.clone(), v_before.clone());
        let mut image = cache.clone();
        let words = kv_row / 2;
        for &(seq, slot) in &new_slots {
            let stored_words = &k_after[slot * words..][..words];
            k_expected[slot * words..][..words].copy_from_slice(stored_words);
            v_expected[slot * words..][..words]
                .copy_from_slice(&pack_halves(&v_new[seq * kv_row..][..kv_row]));
            let stored = unpack_halves(stored_words);
            let tolerance = rope_tolerance(context_lens[seq] as u32) + 2e-6 + F16_ROUNDING;
            assert_close(
                &format!("{what}: stored key"),
                &stored,
                &k_heads[seq * kv_row..][..kv_row],
                tolerance,
            );
            image.write(slot, &stored, &v_new[seq * kv_row..][..kv_row]);
        }
        assert!(k_after == k_expected, "{what}: the K cache changed outside the new tokens' slots");
        assert!(v_after == v_expected, "{what}: the V cache is not the old one with the new values");
        let got = pollster::block_on(out.to_f32(ctx)).unwrap();
        assert_close(&what, &got, &expected_with(&image), ATTENTION_TOLERANCE);
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
        Transform { layout: RopeLayout::Interleaved, rotated_dims: Some(4), norms: Some(NormWeight::Scale) },
    ];
    for kind in kinds {
        check_decode(&format!("decode hd12 6/2 {kind:?}"), heads, 5, &[9, 1, 40], None, None, kind);
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
    let batch = PrefillBatch { seq_ids: &seq_ids_gpu, positions: &positions_gpu, block_table: &block_table };
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
    check_prefill("prefill hd128 4/1 chunks", heads, 16, &chunks, Some(50), Some(3.0), TokenOrder::Grouped);
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
    check_prefill("prefill hd256 8/8", heads, 16, &[(60, 21), (0, 2)], Some(30), None, TokenOrder::Grouped);
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
        let before = pack_halves(&rng.f32s(n_slots * row, -1.0, 1.0));
        let shape = [num_blocks, block_size, n_kv_heads, head_dim / 2];
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
            let read = |t: &Tensor| pollster::block_on(t.to_u32(ctx)).unwrap();
            (read(&q), read(&k_cache), read(&v_cache))
        };
        let (fused, separate) = (run(true), run(false));
        let what = format!("{layout:?}, {rotated_dims} of {head_dim} dims rotated");
        assert_ne!(separate.0, bytemuck::cast_slice::<f32, u32>(&q), "{what}: the rotation changes q");
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
    let before_k = pack_halves(&rng.f32s(n_slots * row, -1.0, 1.0));
    let before_v = pack_halves(&rng.f32s(n_slots * row, -1.0, 1.0));
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

    let shape = [num_blocks, block_size, n_kv_heads, head_dim / 2];
    let k = Tensor::from_slice(ctx, "k_cache", &shape, &before_k).unwrap();
    let v = Tensor::from_slice(ctx, "v_cache", &shape, &before_v).unwrap();
    let k_new_gpu = Tensor::from_slice(ctx, "k_new", &[n_tokens, row], &k_new).unwrap();
    let v_new_gpu = Tensor::from_slice(ctx, "v_new", &[n_tokens, row], &v_new).unwrap();
    let slots_gpu = Tensor::from_slice(ctx, "slots", &[n_tokens], &slots).unwrap();
    let mut encoder = ctx.encoder("test");
    store_kv(ctx, &mut encoder, &KvCacheLayer::new(&k, &v), &k_new_gpu, &v_new_gpu, &slots_gpu).unwrap();
    ctx.submit(encoder).unwrap();

    // Rounded to nearest f16, as the half crate rounds.
    let (mut expected_k, mut expected_v) = (before_k, before_v);
    let words = row / 2;
    for (t, &slot) in slots.iter().enumerate().filter(|&(_, &s)| (s as usize) < n_slots) {
        let slot = slot as usize;
        expected_k[slot * words..][..words].copy_from_slice(&pack_halves(&k_new[t * row..][..row]));
        expected_v[slot * words..][..words].copy_from_slice(&pack_halves(&v_new[t * row..][..row]));
    }
    assert_eq!(pollster::block_on(k.to_u32(ctx)).unwrap(), expected_k, "K cache");
    assert_eq!(pollster::block_on(v.to_u32(ctx)).unwrap(), expected_v, "V cache");
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
    validate_wgsl(
        &KernelSource::new("kv_store", &[KV_HALVES, KV_STORE]).define("WG", format!("{KV_STORE_WG}u")),
    );
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
        for group_heads in (1..=DECODE_MAX_GROUP_HEADS).filter(|g| g * head_dim <= SERIAL_MAX_HEAD_VALUES) {
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
    let (k, v) = (tensor(&[4, 16, 2, 32]), tensor(&[4, 16, 2, 32]));
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
    let (k_big, v_big) = (tensor(&[1, 4, 1, 130]), tensor(&[1, 4, 1, 130]));
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
