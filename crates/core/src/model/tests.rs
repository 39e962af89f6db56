//! Every architecture on tiny random models written as GGUF files, against a plain f64 CPU
//! forward pass of the same architecture: checks that each layer is wired as its diagram says
//! (biases, head norms, rope layouts and bases, sliding windows, post norms, tied outputs) on
//! models small enough to run in milliseconds. The two real models are checked against
//! llama.cpp in `tests/tests/model_reference.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use half::f16;

use super::*;
use crate::gguf::GgufWriter;
use crate::gguf::MetadataValue;
use crate::gpu::GpuOptions;
use crate::kernels::testing::Rng;
use crate::model::config::Architecture;
use crate::quant::QuantType;

/// Bound on the difference of GPU and CPU logits, relative to the row's largest |logit|. f32
/// rounding through a few layers of width 64 stays below 1e-6; the KV cache's f16 adds more:
/// where a key or value's f32 value on the GPU and f64 value here lie on either side of an f16
/// rounding boundary, the two passes store it an f16 ulp apart (which elements do varies from
/// run to run with the GPU's last f32 bits). Measured over 20 runs of the four tests: at most
/// 5.8e-5 (qwen3). A wrong rope base, window or norm moves logits by a tenth or more.
const LOGIT_TOLERANCE: f64 = 2e-4;

/// A test device of its own: [`Model::load`] takes a shared context.
fn gpu() -> Arc<GpuContext> {
    static CTX: std::sync::OnceLock<Arc<GpuContext>> = std::sync::OnceLock::new();
    CTX.get_or_init(|| {
        pollster::block_on(GpuContext::new(&GpuOptions::from_env()))
            .unwrap_or_else(|e| panic!("model tests need a GPU adapter (they never skip): {e}"))
    })
    .clone()
}

/// Hyper-parameters of a tiny model.
#[derive(Clone, Copy)]
struct Tiny {
    arch: Architecture,
    layers: usize,
    hidden: usize,
    ffn: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_dims: usize,
    rope_base: f32,
    vocab: usize,
    /// Gemma 3's window; `None` elsewhere.
    window: Option<u32>,
    tied: bool,
    /// Store the matrices as F16 instead of F32.
    f16_weights: bool,
}

/// A tiny model's tensors: name, GGUF shape, f32 values (as stored, after any f16 rounding).
struct TinyWeights {
    tensors: Vec<(String, Vec<usize>, Vec<f32>, QuantType)>,
    index: HashMap<String, usize>,
}

impl TinyWeights {
    fn get(&self, name: &str) -> &[f32] {
        &self.tensors[self.index[name]].2
    }

    fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }
}

fn random_weights(tiny: &Tiny, rng: &mut Rng) -> TinyWeights {
    let mut tensors = Vec::new();
    let matrix_quant = if tiny.f16_weights { QuantType::F16 } else { QuantType::F32 };
    let matrix = |name: String, rows: usize, cols: usize, rng: &mut Rng, tensors: &mut Vec<_>| {
        // Uniform with variance 1 / cols: outputs of the scale of the inputs.
        let bound = (3.0 / cols as f32).sqrt();
        let mut values = rng.f32s(rows * cols, -bound, bound);
        if matrix_quant == QuantType::F16 {
            values.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
        }
        tensors.push((name, vec![cols, rows], values, matrix_quant));
    };
    let vector = |name: String, len: usize, lo: f32, hi: f32, rng: &mut Rng, tensors: &mut Vec<_>| {
        tensors.push((name, vec![len], rng.f32s(len, lo, hi), QuantType::F32));
    };
    let (q_width, kv_width) = (tiny.heads * tiny.head_dim, tiny.kv_heads * tiny.head_dim);
    // The embedding's rows are the scale of a normalised state: unit variance.
    tensors.push((
        "token_embd.weight".into(),
        vec![tiny.hidden, tiny.vocab],
        rng.f32s(tiny.vocab * tiny.hidden, -1.7, 1.7),
        QuantType::F32,
    ));
    for l in 0..tiny.layers {
        let name = |suffix: &str| format!("blk.{l}.{suffix}");
        vector(name("attn_norm.weight"), tiny.hidden, 0.5, 1.5, rng, &mut tensors);
        matrix(name("attn_q.weight"), q_width, tiny.hidden, rng, &mut tensors);
        matrix(name("attn_k.weight"), kv_width, tiny.hidden, rng, &mut tensors);
        matrix(name("attn_v.weight"), kv_width, tiny.hidden, rng, &mut tensors);
        if tiny.arch == Architecture::Qwen2 {
            vector(name("attn_q.bias"), q_width, -0.5, 0.5, rng, &mut tensors);
            vector(name("attn_k.bias"), kv_width, -0.5, 0.5, rng, &mut tensors);
            vector(name("attn_v.bias"), kv_width, -0.5, 0.5, rng, &mut tensors);
        }
        if matches!(tiny.arch, Architecture::Qwen3 | Architecture::Gemma3) {
            vector(name("attn_q_norm.weight"), tiny.head_dim, 0.5, 1.5, rng, &mut tensors);
            vector(name("attn_k_norm.weight"), tiny.head_dim, 0.5, 1.5, rng, &mut tensors);
        }
        matrix(name("attn_output.weight"), tiny.hidden, q_width, rng, &mut tensors);
        vector(name("ffn_norm.weight"), tiny.hidden, 0.5, 1.5, rng, &mut tensors);
        matrix(name("ffn_gate.weight"), tiny.ffn, tiny.hidden, rng, &mut tensors);
        matrix(name("ffn_up.weight"), tiny.ffn, tiny.hidden, rng, &mut tensors);
        matrix(name("ffn_down.weight"), tiny.hidden, tiny.ffn, rng, &mut tensors);
        if tiny.arch == Architecture::Gemma3 {
            vector(name("post_attention_norm.weight"), tiny.hidden, 0.5, 1.5, rng, &mut tensors);
            vector(name("post_ffw_norm.weight"), tiny.hidden, 0.5, 1.5, rng, &mut tensors);
        }
    }
    vector("output_norm.weight".into(), tiny.hidden, 0.5, 1.5, rng, &mut tensors);
    if !tiny.tied {
        matrix("output.weight".into(), tiny.vocab, tiny.hidden, rng, &mut tensors);
    }
    let index = tensors.iter().enumerate().map(|(i, t)| (t.0.clone(), i)).collect();
    TinyWeights { tensors, index }
}

fn metadata(tiny: &Tiny) -> Vec<(String, MetadataValue)> {
    let arch = tiny.arch.name();
    let mut entries = vec![("general.architecture".to_string(), MetadataValue::String(arch.into()))];
    let mut put = |key: &str, value: MetadataValue| entries.push((format!("{arch}.{key}"), value));
    put("block_count", MetadataValue::U32(tiny.layers as u32));
    put("context_length", MetadataValue::U32(256));
    put("embedding_length", MetadataValue::U32(tiny.hidden as u32));
    put("feed_forward_length", MetadataValue::U32(tiny.ffn as u32));
    put("attention.head_count", MetadataValue::U32(tiny.heads as u32));
    put("attention.head_count_kv", MetadataValue::U32(tiny.kv_heads as u32));
    put("attention.layer_norm_rms_epsilon", MetadataValue::F32(1e-5));
    put("rope.freq_base", MetadataValue::F32(tiny.rope_base));
    if tiny.head_dim != tiny.hidden / tiny.heads {
        put("attention.key_length", MetadataValue::U32(tiny.head_dim as u32));
        put("attention.value_length", MetadataValue::U32(tiny.head_dim as u32));
    }
    if tiny.rope_dims != tiny.head_dim {
        put("rope.dimension_count", MetadataValue::U32(tiny.rope_dims as u32));
    }
    if let Some(window) = tiny.window {
        put("attention.sliding_window", MetadataValue::U32(window));
    }
    entries
}

/// A GGUF v3 file of `metadata` and `weights` (F32, or F16 where the weight says so).
fn gguf_bytes(metadata: &[(String, MetadataValue)], weights: &TinyWeights) -> Vec<u8> {
    let mut writer = GgufWriter::new(3);
    for (key, value) in metadata {
        writer = writer.metadata(key, value.clone());
    }
    for (name, shape, values, quant) in &weights.tensors {
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let (type_id, data) = match quant {
            QuantType::F16 => (1, values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect()),
            _ => (0, values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        writer = writer.tensor(name, &dims, type_id, data);
    }
    writer.build().0
}

// ---- the CPU reference ---------------------------------------------------------------------

fn mat_vec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len()).map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum()).collect()
}

/// RMSNorm of each `weight.len()`-long run of `x`.
fn rms_norm(x: &[f64], weight: &[f32]) -> Vec<f64> {
    x.chunks_exact(weight.len())
        .flat_map(|row| {
            let mean_square = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
            let scale = 1.0 / (mean_square + 1e-5).sqrt();
            row.iter().zip(weight).map(move |(v, &w)| v * scale * f64::from(w))
        })
        .collect()
}

/// Rotates each head of `x` in place for `position`.
fn rope(x: &mut [f64], tiny: &Tiny, base: f64, position: usize) {
    let pairs = tiny.rope_dims / 2;
    for head in x.chunks_exact_mut(tiny.head_dim) {
        for i in 0..pairs {
            let theta = position as f64 * base.powf(-2.0 * i as f64 / tiny.rope_dims as f64);
            let (a, b) = if tiny.arch == Architecture::Llama { (2 * i, 2 * i + 1) } else { (i, i + pairs) };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * theta.cos() - x1 * theta.sin();
            head[b] = x0 * theta.sin() + x1 * theta.cos();
        }
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// The logits of every token of one sequence, by the architecture's diagram in f64.
fn reference_logits(tiny: &Tiny, w: &TinyWeights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let output = if tiny.tied { w.get("token_embd.weight") } else { w.get("output.weight") };
    reference_hidden(tiny, w, tokens).iter().map(|h| mat_vec(output, h)).collect()
}

/// The final hidden state of every position, after the output norm: what the output
/// projection takes, and what embeddings are pooled from.
fn reference_hidden(tiny: &Tiny, w: &TinyWeights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let gemma = tiny.arch == Architecture::Gemma3;
    let embedding = w.get("token_embd.weight");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            let row = &embedding[t as usize * tiny.hidden..(t as usize + 1) * tiny.hidden];
            let scale = if gemma { (tiny.hidden as f64).sqrt() } else { 1.0 };
            row.iter().map(|&v| f64::from(v) * scale).collect()
        })
        .collect();
    let group = tiny.heads / tiny.kv_heads;
    for l in 0..tiny.layers {
        let name = |suffix: &str| format!("blk.{l}.{suffix}");
        let local = gemma && l % 6 != 5;
        let base = if local { 10000.0 } else { f64::from(tiny.rope_base) };
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        for (position, x) in xs.iter().enumerate() {
            let h = rms_norm(x, w.get(&name("attn_norm.weight")));
            let project = |role: &str| {
                let mut y = mat_vec(w.get(&name(&format!("attn_{role}.weight"))), &h);
                if w.has(&name(&format!("attn_{role}.bias"))) {
                    y.iter_mut()
                        .zip(w.get(&name(&format!("attn_{role}.bias"))))
                        .for_each(|(y, &b)| *y += f64::from(b));
                }
                if role != "v" && w.has(&name(&format!("attn_{role}_norm.weight"))) {
                    y = rms_norm(&y, w.get(&name(&format!("attn_{role}_norm.weight"))));
                }
                if role != "v" {
                    rope(&mut y, tiny, base, position);
                }
                y
            };
            // Keys and values as the f16 cache holds them.
            let cached = |y: Vec<f64>| y.into_iter().map(|x| f64::from(f16::from_f64(x))).collect::<Vec<_>>();
            qs.push(project("q"));
            ks.push(cached(project("k")));
            vs.push(cached(project("v")));
        }
        let scale = 1.0 / (tiny.head_dim as f64).sqrt();
        for (p, x) in xs.iter_mut().enumerate() {
            let first_key = match (local, tiny.window) {
                (true, Some(window)) => (p + 1).saturating_sub(window as usize),
                _ => 0,
            };
            let mut attention = vec![0.0; tiny.heads * tiny.head_dim];
            for head in 0..tiny.heads {
                let (qh, kv) = (head * tiny.head_dim, (head / group) * tiny.head_dim);
                let q = &qs[p][qh..qh + tiny.head_dim];
                let scores: Vec<f64> = (first_key..=p)
                    .map(|j| {
                        q.iter().zip(&ks[j][kv..kv + tiny.head_dim]).map(|(a, b)| a * b).sum::<f64>() * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (j, weight) in (first_key..=p).zip(&weights) {
                    for d in 0..tiny.head_dim {
                        attention[qh + d] += weight / total * vs[j][kv + d];
                    }
                }
            }
            let mut o = mat_vec(w.get(&name("attn_output.weight")), &attention);
            if gemma {
                o = rms_norm(&o, w.get(&name("post_attention_norm.weight")));
            }
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);

            let h = rms_norm(x, w.get(&name("ffn_norm.weight")));
            let gate = mat_vec(w.get(&name("ffn_gate.weight")), &h);
            let up = mat_vec(w.get(&name("ffn_up.weight")), &h);
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(&g, &u)| if gemma { gelu_tanh(g) * u } else { silu(g) * u })
                .collect();
            let mut down = mat_vec(w.get(&name("ffn_down.weight")), &act);
            if gemma {
                down = rms_norm(&down, w.get(&name("post_ffw_norm.weight")));
            }
            x.iter_mut().zip(&down).for_each(|(x, d)| *x += d);
        }
    }
    xs.iter().map(|x| rms_norm(x, w.get("output_norm.weight"))).collect()
}

// ---- the tests -------------------------------------------------------------------------------

const LLAMA: Tiny = Tiny {
    arch: Architecture::Llama,
    layers: 2,
    hidden: 64,
    ffn: 40,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    // Partial rotation: the last 4 dims of each head pass through.
    rope_dims: 12,
    rope_base: 10000.0,
    vocab: 37,
    window: None,
    tied: false,
    f16_weights: false,
};

fn tiny_file(tiny: &Tiny, rng: &mut Rng) -> (TinyWeights, GgufFile) {
    let weights = random_weights(tiny, rng);
    let file = GgufFile::from_bytes(gguf_bytes(&metadata(tiny), &weights)).unwrap();
    (weights, file)
}

/// Compares rows of GPU output (logits, or hidden states), the `i`-th of `positions[i]`, with
/// the CPU reference's rows; returns the worst error relative to each row's largest |value|.
fn compare(what: &str, tiny: &Tiny, got: &[f32], expected: &[Vec<f64>], positions: &[usize]) -> f64 {
    let width = expected[0].len();
    assert_eq!(got.len(), positions.len() * width, "{what}: rows");
    let mut worst = 0.0f64;
    for (row, &position) in got.chunks_exact(width).zip(positions) {
        let reference = &expected[position];
        let scale = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (i, (&g, &e)) in row.iter().zip(reference).enumerate() {
            let error = (f64::from(g) - e).abs() / scale;
            assert!(
                error <= LOGIT_TOLERANCE,
                "{} {what}: position {position} value {i}: got {g}, expected {e} (error {error:.2e} of the row's max {scale:.3})",
                tiny.arch.name()
            );
            worst = worst.max(error);
        }
    }
    worst
}

/// Runs `tokens` through the GPU model in one pass and compares every row of logits with the
/// CPU reference; then again as a prompt and one decode step per token, two sequences at a
/// time (the decode kernel normalises, rotates and stores the new keys itself).
fn check(tiny: Tiny) {
    let mut rng = Rng::new(&format!("tiny {}", tiny.arch.name()));
    let (weights, file) = tiny_file(&tiny, &mut rng);
    let model = Model::load(gpu(), &file).unwrap();
    assert_eq!(model.config().architecture, tiny.arch);
    let tokens: Vec<u32> = (0..11).map(|_| rng.usize(0, tiny.vocab) as u32).collect();
    let expected = reference_logits(&tiny, &weights, &tokens);
    let read = |logits: Tensor| pollster::block_on(logits.to_f32(&gpu())).unwrap();

    let mut cache = model.new_kv_cache(Some(3 * tokens.len())).unwrap();
    let mut table = cache.new_sequence();
    cache.append(&mut table, tokens.len()).unwrap();
    let chunk = SequenceChunk { table: &table, tokens: &tokens, first_position: 0, logits: LogitRows::All };
    let all: Vec<usize> = (0..tokens.len()).collect();
    let worst = compare("one pass", &tiny, &read(model.forward(&cache, &[chunk]).unwrap()), &expected, &all);
    eprintln!("{}: worst logit error {worst:.2e} of the row's largest |logit|", tiny.arch.name());

    let prompt = 4;
    let mut tables = [cache.new_sequence(), cache.new_sequence()];
    for table in &mut tables {
        cache.append(table, prompt).unwrap();
    }
    let chunks = tables.each_ref().map(|table| SequenceChunk {
        table,
        tokens: &tokens[..prompt],
        first_position: 0,
        logits: LogitRows::None,
    });
    model.forward(&cache, &chunks).unwrap();
    let mut worst = 0.0f64;
    for position in prompt..tokens.len() {
        for table in &mut tables {
            cache.append(table, 1).unwrap();
        }
        let chunks = tables.each_ref().map(|table| SequenceChunk {
            table,
            tokens: &tokens[position..=position],
            first_position: position,
            logits: LogitRows::Last,
        });
        let got = read(model.forward(&cache, &chunks).unwrap());
        worst = worst.max(compare("decode", &tiny, &got, &expected, &[position, position]));
    }
    eprintln!("{}: decoding, worst logit error {worst:.2e}", tiny.arch.name());
}

#[test]
fn llama_matches_the_reference() {
    check(LLAMA);
}

#[test]
fn qwen2_matches_the_reference() {
    check(Tiny { arch: Architecture::Qwen2, rope_dims: 16, tied: true, rope_base: 1e6, ..LLAMA });
}

#[test]
fn qwen3_matches_the_reference() {
    // Heads wider than hidden / heads, as in the real Qwen 3 models.
    check(Tiny {
        arch: Architecture::Qwen3,
        head_dim: 24,
        rope_dims: 24,
        tied: true,
        f16_weights: true,
        ..LLAMA
    });
}

#[test]
fn gemma3_matches_the_reference() {
    check(GEMMA3);
}

/// Seven layers: five local ones with a window of 3 tokens, the global layer 5, and local 6.
const GEMMA3: Tiny = Tiny {
    arch: Architecture::Gemma3,
    layers: 7,
    kv_heads: 1,
    head_dim: 24,
    rope_dims: 24,
    rope_base: 1e6,
    window: Some(3),
    tied: true,
    ..LLAMA
};

/// The hidden output (what embeddings pool) equals the CPU reference's normalised final states,
/// for the rows asked for, chunk by chunk.
#[test]
fn hidden_states_match_the_reference() {
    for tiny in [LLAMA, GEMMA3] {
        let mut rng = Rng::new(&format!("hidden {}", tiny.arch.name()));
        let (weights, file) = tiny_file(&tiny, &mut rng);
        let model = Model::load(gpu(), &file).unwrap();
        let tokens: Vec<u32> = (0..9).map(|_| rng.usize(0, tiny.vocab) as u32).collect();
        let expected = reference_hidden(&tiny, &weights, &tokens);
        let mut cache = model.new_kv_cache(Some(2 * tokens.len())).unwrap();
        let mut table = cache.new_sequence();
        cache.append(&mut table, tokens.len()).unwrap();
        let (first, second) = tokens.split_at(5);
        let chunks = [
            SequenceChunk { table: &table, tokens: first, first_position: 0, logits: LogitRows::All },
            SequenceChunk { table: &table, tokens: second, first_position: 5, logits: LogitRows::Last },
        ];
        // One sequence in two chunks of one pass is not a batch the engine makes; two passes are.
        let rows: Vec<f32> = chunks
            .iter()
            .flat_map(|chunk| {
                pollster::block_on(model.forward_hidden(&cache, &[*chunk]).unwrap().to_f32(&gpu())).unwrap()
            })
            .collect();
        let positions: Vec<usize> = (0..5).chain([8]).collect();
        compare("hidden states", &tiny, &rows, &expected, &positions);
    }
}

#[test]
fn config_follows_llama_cpp_rules() {
    let mut rng = Rng::new("tiny config");
    let gemma = Tiny {
        arch: Architecture::Gemma3,
        layers: 7,
        head_dim: 24,
        rope_dims: 24,
        window: Some(3),
        tied: true,
        ..LLAMA
    };
    let (_, file) = tiny_file(&gemma, &mut rng);
    let config = ModelConfig::from_gguf(&file).unwrap();
    let local: Vec<bool> = (0..7).map(|l| config.is_sliding_window_layer(l)).collect();
    assert_eq!(local, [true, true, true, true, true, false, true]);
    assert_eq!(config.sliding_window.unwrap().rope.base, 10000.0);
    assert_eq!(config.attention_scale, 1.0 / 24f32.sqrt());
    assert_eq!(config.rope_layout, crate::kernels::rope::RopeLayout::NeoX);
    assert!(config.tied_output);

    let (_, file) = tiny_file(&LLAMA, &mut rng);
    let config = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!(config.rope_layout, crate::kernels::rope::RopeLayout::Interleaved);
    assert_eq!((config.head_dim, config.rope_dims, config.vocab_size), (16, 12, 37));
    assert!(!config.tied_output && config.sliding_window.is_none());
    assert_eq!(config.pooling, Pooling::Mean, "no pooling_type pools by the mean");

    // `pooling_type` as llama.cpp numbers it.
    let weights = random_weights(&LLAMA, &mut rng);
    for (value, pooling) in [(0, Pooling::Mean), (1, Pooling::Mean), (2, Pooling::First), (3, Pooling::Last)]
    {
        let mut entries = metadata(&LLAMA);
        entries.push(("llama.pooling_type".into(), MetadataValue::U32(value)));
        let file = GgufFile::from_bytes(gguf_bytes(&entries, &weights)).unwrap();
        assert_eq!(ModelConfig::from_gguf(&file).unwrap().pooling, pooling);
    }
}

/// Loads a tiny llama whose metadata or tensors were changed by `edit`; returns the error.
fn load_error(edit: impl FnOnce(&mut Vec<(String, MetadataValue)>, &mut TinyWeights)) -> String {
    let mut rng = Rng::new("tiny errors");
    let mut weights = random_weights(&LLAMA, &mut rng);
    let mut entries = metadata(&LLAMA);
    edit(&mut entries, &mut weights);
    weights.index = weights.tensors.iter().enumerate().map(|(i, t)| (t.0.clone(), i)).collect();
    let file = GgufFile::from_bytes(gguf_bytes(&entries, &weights)).unwrap();
    match Model::load(gpu(), &file) {
        Ok(_) => panic!("the model loaded"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn unsupported_or_broken_models_are_errors_that_say_what_is_wrong() {
    let error = load_error(|entries, _| entries[0].1 = MetadataValue::String("mamba".into()));
    assert!(error.contains("'mamba' is not supported") && error.contains("gemma3"), "{error}");
    let error = load_error(|entries, _| entries.retain(|(key, _)| key != "llama.block_count"));
    assert!(error.contains("llama.block_count") && error.contains("missing"), "{error}");
    let error = load_error(|_, weights| weights.tensors.retain(|t| t.0 != "blk.1.ffn_up.weight"));
    assert!(error.contains("blk.1.ffn_up.weight") && error.contains("missing"), "{error}");
    let error = load_error(|_, weights| {
        let q = weights.tensors.iter_mut().find(|t| t.0 == "blk.0.attn_q.weight").unwrap();
        q.1 = vec![32, 128];
    });
    assert!(error.contains("blk.0.attn_q.weight") && error.contains("[64, 64]"), "{error}");
    let error = load_error(|entries, _| {
        entries.push(("llama.rope.scaling.type".into(), MetadataValue::String("yarn".into())));
    });
    assert!(error.contains("'yarn' is not supported"), "{error}");
    let error = load_error(|entries, _| entries.push(("llama.pooling_type".into(), MetadataValue::U32(4))));
    assert!(error.contains("llama.pooling_type") && error.contains("rank"), "{error}");
}

/// The model a browser builds: the header from the file's first bytes, the vectors handed in,
/// then the matrices written in pieces of at most `max_piece` bytes, in the order the upload
/// asks for them.
fn load_in_pieces(bytes: &[u8], max_piece: usize) -> Model {
    let whole = GgufFile::from_bytes(bytes.to_vec()).unwrap();
    let mut header =
        GgufFile::from_header(&bytes[..whole.data_offset()], bytes.len() as u64).unwrap().unwrap();
    for tensor in crate::model::tensors_read_first(&whole) {
        header.insert_tensor_bytes(tensor.name(), whole.tensor_bytes(tensor).unwrap().to_vec()).unwrap();
    }
    let mut upload = Model::begin_load(gpu(), &header).unwrap();
    let mut last_end = 0;
    while let Some(piece) = upload.next_piece(max_piece) {
        assert!(piece.start >= last_end, "pieces come in the file's order");
        last_end = piece.end;
        upload.write_next(&bytes[piece.start as usize..piece.end as usize]).unwrap();
    }
    upload.finish().unwrap()
}

#[test]
fn a_model_written_piece_by_piece_from_its_header_computes_as_one_loaded_whole() {
    let qwen3 = Tiny { arch: Architecture::Qwen3, head_dim: 24, rope_dims: 24, f16_weights: true, ..LLAMA };
    for tiny in [LLAMA, qwen3] {
        let mut rng = Rng::new(&format!("pieces {}", tiny.arch.name()));
        let bytes = gguf_bytes(&metadata(&tiny), &random_weights(&tiny, &mut rng));
        let whole = Model::load(gpu(), &GgufFile::from_bytes(bytes.clone()).unwrap()).unwrap();
        let tokens: Vec<u32> = (0..7).map(|_| rng.usize(0, tiny.vocab) as u32).collect();
        let logits = |model: &Model| {
            let mut cache = model.new_kv_cache(Some(tokens.len())).unwrap();
            let mut table = cache.new_sequence();
            cache.append(&mut table, tokens.len()).unwrap();
            let chunk =
                SequenceChunk { table: &table, tokens: &tokens, first_position: 0, logits: LogitRows::All };
            let logits = model.forward(&cache, &[chunk]).unwrap();
            let rows: Vec<Vec<f64>> = pollster::block_on(logits.to_f32(&gpu()))
                .unwrap()
                .chunks(tiny.vocab)
                .map(|row| row.iter().map(|&v| f64::from(v)).collect())
                .collect();
            rows
        };
        let expected = logits(&whole);
        let all: Vec<usize> = (0..tokens.len()).collect();
        // One row at a time, a few rows, whole tensors.
        for max_piece in [1, 300, usize::MAX] {
            let got: Vec<f32> =
                logits(&load_in_pieces(&bytes, max_piece)).concat().iter().map(|&v| v as f32).collect();
            compare(&format!("pieces of {max_piece} bytes"), &tiny, &got, &expected, &all);
        }
    }
}

#[test]
fn an_upload_refuses_bytes_that_are_not_the_next_rows_and_cannot_finish_early() {
    let mut rng = Rng::new("upload errors");
    let bytes = gguf_bytes(&metadata(&LLAMA), &random_weights(&LLAMA, &mut rng));
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    let mut upload = Model::begin_load(gpu(), &file).unwrap();
    let first = upload.next_tensor().unwrap().clone();
    let error = upload.write_next(&[0; 3]).unwrap_err().to_string();
    assert!(error.contains(first.name()) && error.contains("3 bytes"), "{error}");
    let piece = upload.next_piece(1).unwrap();
    assert_eq!(piece.end - piece.start, first.row_bytes() as u64);
    upload.write_next(&bytes[piece.start as usize..piece.end as usize]).unwrap();
    let error = upload.finish().err().unwrap().to_string();
    assert!(error.contains(first.name()) && error.contains("never written"), "{error}");
}
