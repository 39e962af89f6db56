//! Synthetic models: GGUF files with random weights at the exact shapes, metadata and tensor
//! type mixes of named real models, deterministic from a seed.
//!
//! Speed, memory and load behaviour depend on shapes and types alone, so a synthetic
//! Llama-3.1-8B measures what the real one would, on a machine that cannot download it (CI, a
//! GPU machine without network), and llama.cpp reads the same file. The weights are random
//! quantized blocks of standard deviation 0.02 (norm weights ~1), the vocabulary a synthetic
//! byte-level BPE or SentencePiece one of the real size (`vocab.rs`).
//!
//! ```no_run
//! # fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use flint_core::synth::{QuantMix, SHAPES, write_model};
//!
//! let shape = SHAPES.iter().find(|s| s.name == "llama-3.2-1b").unwrap();
//! let mut file = std::io::BufWriter::new(std::fs::File::create("llama-3.2-1b.q4_k_m.gguf")?);
//! write_model(shape, QuantMix::Q4KM, 1, &mut file, |_written, _total| {})?;
//! # Ok(())
//! # }
//! ```

mod blocks;
mod vocab;

use std::io::Write;

use crate::gguf::{GgufWriter, MetadataArray, MetadataValue};
use crate::quant::QuantType;
use crate::{Error, Result};
use blocks::{SplitMix, tensor_bytes, write_random};
use vocab::{Vocab, bpe_vocab, spm_vocab};

/// Standard deviation of the random weights.
const WEIGHT_SIGMA: f32 = 0.02;

/// The architecture of a synthetic model, as `general.architecture` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthArchitecture {
    /// `llama`: Llama 3, SmolLM2.
    Llama,
    /// `qwen2`: biases on q, k and v.
    Qwen2,
    /// `qwen3`: per-head q and k norms.
    Qwen3,
    /// `gemma3`: sliding-window layers, post norms, per-head q and k norms, a SentencePiece
    /// vocabulary.
    Gemma3,
}

impl SynthArchitecture {
    fn name(self) -> &'static str {
        match self {
            SynthArchitecture::Llama => "llama",
            SynthArchitecture::Qwen2 => "qwen2",
            SynthArchitecture::Qwen3 => "qwen3",
            SynthArchitecture::Gemma3 => "gemma3",
        }
    }
}

/// How a model scales rope positions.
#[derive(Clone, Copy, Debug)]
pub enum RopeScaling {
    /// Llama 3's, stored as per-frequency factors in `rope_freqs.weight`.
    Llama3(Llama3RopeScaling),
    /// Positions divided by the factor (`rope.scaling.type = linear`): Gemma 3's global layers.
    Linear(f32),
}

/// Llama 3's rope scaling.
#[derive(Clone, Copy, Debug)]
pub struct Llama3RopeScaling {
    /// `factor`.
    pub factor: f32,
    /// `low_freq_factor`.
    pub low_freq_factor: f32,
    /// `high_freq_factor`.
    pub high_freq_factor: f32,
    /// `original_max_position_embeddings`.
    pub original_context: u32,
}

/// The shape and metadata of a named model (from its `config.json`).
#[derive(Clone, Copy, Debug)]
pub struct ModelShape {
    /// The name to ask for, e.g. `llama-3.2-1b`.
    pub name: &'static str,
    /// The architecture.
    pub architecture: SynthArchitecture,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of the feed-forward layer.
    pub ffn: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads.
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Tokens in the vocabulary (and rows of the embedding).
    pub vocab: usize,
    /// Context length.
    pub context: usize,
    /// Rope frequency base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// The output projection is the token embedding.
    pub tied: bool,
    /// Rope scaling, when the model has it.
    pub rope_scaling: Option<RopeScaling>,
    /// Tokens a local layer attends to (Gemma 3); 0 for none.
    pub sliding_window: usize,
    /// The vocabulary's kind.
    pub tokenizer: SynthTokenizer,
}

/// The kind of a synthetic vocabulary.
#[derive(Clone, Copy, Debug)]
pub enum SynthTokenizer {
    /// Byte-level BPE (`gpt2`).
    Bpe {
        /// `tokenizer.ggml.pre`.
        pre: &'static str,
        /// Begin- and end-of-text tokens.
        special: [&'static str; 2],
    },
    /// SentencePiece (`llama`) laid out as Gemma's.
    SentencePiece,
}

const LLAMA_3_2: Llama3RopeScaling =
    Llama3RopeScaling { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192 };
const LLAMA_3_1: Llama3RopeScaling = Llama3RopeScaling { factor: 8.0, ..LLAMA_3_2 };
const LLAMA3_SPECIAL: [&str; 2] = ["<|begin_of_text|>", "<|end_of_text|>"];
const QWEN_SPECIAL: [&str; 2] = ["<|im_start|>", "<|endoftext|>"];
const SMOLLM_SPECIAL: [&str; 2] = ["<|im_start|>", "<|im_end|>"];

const LLAMA: ModelShape = ModelShape {
    name: "",
    architecture: SynthArchitecture::Llama,
    hidden: 2048,
    ffn: 8192,
    layers: 16,
    heads: 32,
    kv_heads: 8,
    head_dim: 64,
    vocab: 128_256,
    context: 131_072,
    rope_base: 500_000.0,
    rms_eps: 1e-5,
    tied: true,
    rope_scaling: Some(RopeScaling::Llama3(LLAMA_3_2)),
    sliding_window: 0,
    tokenizer: SynthTokenizer::Bpe { pre: "llama-bpe", special: LLAMA3_SPECIAL },
};

const SMOLLM2: ModelShape = ModelShape {
    name: "",
    hidden: 576,
    ffn: 1536,
    layers: 30,
    heads: 9,
    kv_heads: 3,
    head_dim: 64,
    vocab: 49_152,
    context: 8192,
    rope_base: 100_000.0,
    rope_scaling: None,
    tokenizer: SynthTokenizer::Bpe { pre: "smollm", special: SMOLLM_SPECIAL },
    ..LLAMA
};

const QWEN2: ModelShape = ModelShape {
    name: "",
    architecture: SynthArchitecture::Qwen2,
    hidden: 896,
    ffn: 4864,
    layers: 24,
    heads: 14,
    kv_heads: 2,
    head_dim: 64,
    vocab: 151_936,
    context: 32_768,
    rope_base: 1_000_000.0,
    rms_eps: 1e-6,
    tied: true,
    rope_scaling: None,
    sliding_window: 0,
    tokenizer: SynthTokenizer::Bpe { pre: "qwen2", special: QWEN_SPECIAL },
};

const QWEN3: ModelShape = ModelShape {
    architecture: SynthArchitecture::Qwen3,
    hidden: 1024,
    ffn: 3072,
    layers: 28,
    heads: 16,
    kv_heads: 8,
    head_dim: 128,
    context: 40_960,
    ..QWEN2
};

const GEMMA3: ModelShape = ModelShape {
    name: "",
    architecture: SynthArchitecture::Gemma3,
    hidden: 1152,
    ffn: 6912,
    layers: 26,
    heads: 4,
    kv_heads: 1,
    head_dim: 256,
    vocab: 262_144,
    context: 32_768,
    rope_base: 1_000_000.0,
    rms_eps: 1e-6,
    tied: true,
    rope_scaling: None,
    sliding_window: 512,
    tokenizer: SynthTokenizer::SentencePiece,
};

/// The models [`write_model`] knows, by name.
pub const SHAPES: &[ModelShape] = &[
    ModelShape { name: "llama-3.2-1b", ..LLAMA },
    ModelShape { name: "llama-3.2-3b", hidden: 3072, layers: 28, heads: 24, head_dim: 128, ..LLAMA },
    ModelShape {
        name: "llama-3.1-8b",
        hidden: 4096,
        ffn: 14_336,
        layers: 32,
        head_dim: 128,
        tied: false,
        rope_scaling: Some(RopeScaling::Llama3(LLAMA_3_1)),
        ..LLAMA
    },
    ModelShape { name: "smollm2-135m", ..SMOLLM2 },
    ModelShape {
        name: "smollm2-360m",
        hidden: 960,
        ffn: 2560,
        layers: 32,
        heads: 15,
        kv_heads: 5,
        ..SMOLLM2
    },
    ModelShape {
        name: "smollm2-1.7b",
        hidden: 2048,
        ffn: 8192,
        layers: 24,
        heads: 32,
        kv_heads: 32,
        rope_base: 130_000.0,
        ..SMOLLM2
    },
    ModelShape { name: "qwen2.5-0.5b", ..QWEN2 },
    ModelShape {
        name: "qwen2.5-1.5b",
        hidden: 1536,
        ffn: 8960,
        layers: 28,
        heads: 12,
        kv_heads: 2,
        head_dim: 128,
        ..QWEN2
    },
    ModelShape {
        name: "qwen2.5-7b",
        hidden: 3584,
        ffn: 18_944,
        layers: 28,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
        vocab: 152_064,
        tied: false,
        ..QWEN2
    },
    ModelShape { name: "qwen3-0.6b", ..QWEN3 },
    ModelShape { name: "qwen3-1.7b", hidden: 2048, ffn: 6144, ..QWEN3 },
    ModelShape { name: "qwen3-4b", hidden: 2560, ffn: 9728, layers: 36, heads: 32, ..QWEN3 },
    ModelShape { name: "qwen3-8b", hidden: 4096, ffn: 12_288, layers: 36, heads: 32, tied: false, ..QWEN3 },
    ModelShape { name: "gemma-3-1b", ..GEMMA3 },
    ModelShape {
        name: "gemma-3-4b",
        hidden: 2560,
        ffn: 10_240,
        layers: 34,
        heads: 8,
        kv_heads: 4,
        vocab: 262_208,
        context: 131_072,
        rope_scaling: Some(RopeScaling::Linear(8.0)),
        sliding_window: 1024,
        ..GEMMA3
    },
];

/// Which tensor types a synthetic file uses, as llama.cpp's quantizer would choose them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMix {
    /// Every matrix F16.
    F16,
    /// Every matrix Q8_0.
    Q8_0,
    /// Q4_0, the output projection (or the embedding, when tied) Q6_K.
    Q4_0,
    /// Q4_K_M: Q4_K, with Q6_K for the output projection (or the embedding, when tied) and for the value and down
    /// projections of some layers (the first and last eighth, and every third between).
    Q4KM,
}

impl QuantMix {
    /// Every mix, by name.
    pub const ALL: [(&'static str, QuantMix); 4] = [
        ("f16", QuantMix::F16),
        ("q8_0", QuantMix::Q8_0),
        ("q4_0", QuantMix::Q4_0),
        ("q4_k_m", QuantMix::Q4KM),
    ];

    /// The mix called `name` (`f16`, `q8_0`, `q4_0`, `q4_k_m`).
    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL.iter().find(|(known, _)| *known == name).map(|&(_, mix)| mix).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|(known, _)| *known).collect();
            Error::InvalidParameter {
                field: "quant",
                reason: format!("no quantization mix '{name}': choose one of {}", names.join(", ")),
            }
        })
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            QuantMix::F16 => 1,
            QuantMix::Q4_0 => 2,
            QuantMix::Q8_0 => 7,
            QuantMix::Q4KM => 15,
        }
    }

    /// The type of a matrix `rows x cols`: `role` says which, `layer` where.
    fn matrix_type(self, role: Role, layer: usize, layers: usize, cols: usize) -> QuantType {
        let wanted = match (self, role) {
            (QuantMix::F16, _) => QuantType::F16,
            (QuantMix::Q8_0, _) => QuantType::Q8_0,
            (QuantMix::Q4_0, Role::Output) | (QuantMix::Q4KM, Role::Output) => QuantType::Q6K,
            (QuantMix::Q4_0, _) => QuantType::Q4_0,
            (QuantMix::Q4KM, Role::MoreBits) if uses_more_bits(layer, layers) => QuantType::Q6K,
            (QuantMix::Q4KM, _) => QuantType::Q4K,
        };
        // K-quant blocks are 256 wide: llama.cpp falls back for rows they do not divide.
        match wanted {
            QuantType::Q4K if !cols.is_multiple_of(256) => QuantType::Q5_0,
            QuantType::Q6K if !cols.is_multiple_of(256) => QuantType::Q8_0,
            other => other,
        }
    }
}

/// What a matrix is, for [`QuantMix::matrix_type`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The output projection.
    Output,
    /// A value or down projection: Q4_K_M gives some layers' more bits.
    MoreBits,
    Other,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third layer
/// between.
fn uses_more_bits(layer: usize, layers: usize) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2
}

/// One tensor of the file: name, GGUF dimensions (columns first), type, and how to fill it.
struct TensorPlan {
    name: String,
    dims: Vec<u64>,
    quant: QuantType,
    fill: Fill,
}

enum Fill {
    /// Random weights of mean ~0.
    Weights,
    /// Norm weights, ~1.
    Norm,
    /// Biases, small.
    Bias,
    /// Fixed f32 values (rope frequency factors).
    Values(Vec<f32>),
}

impl TensorPlan {
    fn elements(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    fn bytes(&self) -> usize {
        tensor_bytes(self.quant, self.elements())
    }
}

impl ModelShape {
    /// Parameters in the model (its embedding counted once when tied; the rope frequency
    /// factors, derived from the configuration, are not parameters).
    pub fn parameters(&self) -> usize {
        let tensors = self.tensors(QuantMix::F16);
        tensors.iter().filter(|t| !matches!(t.fill, Fill::Values(_))).map(TensorPlan::elements).sum()
    }

    /// Bytes of tensor data in a file of this shape and `mix`.
    pub fn data_bytes(&self, mix: QuantMix) -> usize {
        self.tensors(mix).iter().map(TensorPlan::bytes).sum()
    }

    fn tensors(&self, mix: QuantMix) -> Vec<TensorPlan> {
        let (hidden, q_width, kv_width) =
            (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let matrix = |name: String, rows: usize, cols: usize, role: Role, layer: usize| TensorPlan {
            name,
            dims: vec![cols as u64, rows as u64],
            quant: mix.matrix_type(role, layer, self.layers, cols),
            fill: Fill::Weights,
        };
        let vector = |name: String, len: usize, fill: Fill| TensorPlan {
            name,
            dims: vec![len as u64],
            quant: QuantType::F32,
            fill,
        };
        // A tied embedding is the output projection too, and llama.cpp types it as one.
        let embedding_role = if self.tied { Role::Output } else { Role::Other };
        let mut tensors = vec![matrix("token_embd.weight".into(), self.vocab, hidden, embedding_role, 0)];
        if let Some(RopeScaling::Llama3(scaling)) = self.rope_scaling {
            tensors.push(vector(
                "rope_freqs.weight".into(),
                self.head_dim / 2,
                Fill::Values(self.rope_factors(scaling)),
            ));
        }
        let gemma = self.architecture == SynthArchitecture::Gemma3;
        for layer in 0..self.layers {
            let name = |suffix: &str| format!("blk.{layer}.{suffix}");
            tensors.push(vector(name("attn_norm.weight"), hidden, Fill::Norm));
            tensors.push(matrix(name("attn_q.weight"), q_width, hidden, Role::Other, layer));
            tensors.push(matrix(name("attn_k.weight"), kv_width, hidden, Role::Other, layer));
            tensors.push(matrix(name("attn_v.weight"), kv_width, hidden, Role::MoreBits, layer));
            if self.architecture == SynthArchitecture::Qwen2 {
                tensors.push(vector(name("attn_q.bias"), q_width, Fill::Bias));
                tensors.push(vector(name("attn_k.bias"), kv_width, Fill::Bias));
                tensors.push(vector(name("attn_v.bias"), kv_width, Fill::Bias));
            }
            if matches!(self.architecture, SynthArchitecture::Qwen3 | SynthArchitecture::Gemma3) {
                tensors.push(vector(name("attn_q_norm.weight"), self.head_dim, Fill::Norm));
                tensors.push(vector(name("attn_k_norm.weight"), self.head_dim, Fill::Norm));
            }
            tensors.push(matrix(name("attn_output.weight"), hidden, q_width, Role::Other, layer));
            if gemma {
                tensors.push(vector(name("post_attention_norm.weight"), hidden, Fill::Norm));
            }
            tensors.push(vector(name("ffn_norm.weight"), hidden, Fill::Norm));
            tensors.push(matrix(name("ffn_gate.weight"), self.ffn, hidden, Role::Other, layer));
            tensors.push(matrix(name("ffn_up.weight"), self.ffn, hidden, Role::Other, layer));
            tensors.push(matrix(name("ffn_down.weight"), hidden, self.ffn, Role::MoreBits, layer));
            if gemma {
                tensors.push(vector(name("post_ffw_norm.weight"), hidden, Fill::Norm));
            }
        }
        tensors.push(vector("output_norm.weight".into(), hidden, Fill::Norm));
        if !self.tied {
            tensors.push(matrix("output.weight".into(), self.vocab, hidden, Role::Output, 0));
        }
        tensors
    }

    /// Llama 3's factor for each rope frequency: high frequencies unscaled, low ones divided
    /// by `factor`, a smooth step between (as `rope_freqs.weight` holds them).
    fn rope_factors(&self, s: Llama3RopeScaling) -> Vec<f32> {
        let old = s.original_context as f32;
        let (low_wavelength, high_wavelength) = (old / s.low_freq_factor, old / s.high_freq_factor);
        (0..self.head_dim / 2)
            .map(|i| {
                let frequency = self.rope_base.powf(-2.0 * i as f32 / self.head_dim as f32);
                let wavelength = 2.0 * std::f32::consts::PI / frequency;
                if wavelength < high_wavelength {
                    1.0
                } else if wavelength > low_wavelength {
                    s.factor
                } else {
                    let smooth =
                        (old / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                    1.0 / ((1.0 - smooth) / s.factor + smooth)
                }
            })
            .collect()
    }

    fn metadata(&self, mix: QuantMix, seed: u64) -> Vec<(String, MetadataValue)> {
        let arch = self.architecture.name();
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let u32_of = |value: usize| MetadataValue::U32(value as u32);
        let string = |value: &str| MetadataValue::String(value.into());
        let mut metadata = vec![
            ("general.architecture".into(), string(arch)),
            ("general.name".into(), MetadataValue::String(format!("{} (synthetic, seed {seed})", self.name))),
            ("general.file_type".into(), MetadataValue::U32(mix.file_type())),
            (key("context_length"), u32_of(self.context)),
            (key("embedding_length"), u32_of(self.hidden)),
            (key("block_count"), u32_of(self.layers)),
            (key("feed_forward_length"), u32_of(self.ffn)),
            (key("attention.head_count"), u32_of(self.heads)),
            (key("attention.head_count_kv"), u32_of(self.kv_heads)),
            (key("attention.key_length"), u32_of(self.head_dim)),
            (key("attention.value_length"), u32_of(self.head_dim)),
            (key("attention.layer_norm_rms_epsilon"), MetadataValue::F32(self.rms_eps)),
            (key("rope.freq_base"), MetadataValue::F32(self.rope_base)),
            (key("rope.dimension_count"), u32_of(self.head_dim)),
            (key("vocab_size"), u32_of(self.vocab)),
        ];
        if self.sliding_window > 0 {
            metadata.push((key("attention.sliding_window"), u32_of(self.sliding_window)));
        }
        if let Some(RopeScaling::Linear(factor)) = self.rope_scaling {
            metadata.push((key("rope.scaling.type"), string("linear")));
            metadata.push((key("rope.scaling.factor"), MetadataValue::F32(factor)));
        }
        let (model, pre, vocab, add_bos) = match self.tokenizer {
            SynthTokenizer::Bpe { pre, special } => {
                let vocab = bpe_vocab(self.vocab, special[0], special[1], seed);
                ("gpt2", pre, vocab, self.architecture == SynthArchitecture::Llama)
            }
            SynthTokenizer::SentencePiece => ("llama", "default", spm_vocab(self.vocab, seed), true),
        };
        let Vocab { tokens, token_types, merges, scores, bos, eos } = vocab;
        let array = |array: MetadataArray| MetadataValue::Array(array);
        metadata.push(("tokenizer.ggml.model".into(), string(model)));
        metadata.push(("tokenizer.ggml.pre".into(), string(pre)));
        metadata.push(("tokenizer.ggml.tokens".into(), array(MetadataArray::String(tokens))));
        metadata.push(("tokenizer.ggml.token_type".into(), array(MetadataArray::I32(token_types))));
        if !merges.is_empty() {
            metadata.push(("tokenizer.ggml.merges".into(), array(MetadataArray::String(merges))));
        }
        if !scores.is_empty() {
            metadata.push(("tokenizer.ggml.scores".into(), array(MetadataArray::F32(scores))));
        }
        metadata.push(("tokenizer.ggml.bos_token_id".into(), MetadataValue::U32(bos)));
        metadata.push(("tokenizer.ggml.eos_token_id".into(), MetadataValue::U32(eos)));
        metadata.push(("tokenizer.ggml.add_bos_token".into(), MetadataValue::Bool(add_bos)));
        metadata
    }
}

/// The shape called `name`, or an error listing the known ones.
pub fn shape(name: &str) -> Result<&'static ModelShape> {
    SHAPES.iter().find(|shape| shape.name == name).ok_or_else(|| {
        let names: Vec<&str> = SHAPES.iter().map(|shape| shape.name).collect();
        Error::InvalidParameter {
            field: "model",
            reason: format!("no synthetic model '{name}': choose one of {}", names.join(", ")),
        }
    })
}

/// Writes a synthetic GGUF file of `shape` in `mix` to `out`, its weights drawn from `seed`;
/// `progress(written, total)` follows the tensor data's bytes. Fails only when `out` does.
pub fn write_model(
    shape: &ModelShape,
    mix: QuantMix,
    seed: u64,
    out: &mut dyn Write,
    mut progress: impl FnMut(u64, u64),
) -> std::io::Result<()> {
    let tensors = shape.tensors(mix);
    let total: usize = tensors.iter().map(TensorPlan::bytes).sum();
    let mut writer = GgufWriter::new(3);
    for (key, value) in shape.metadata(mix, seed) {
        writer = writer.metadata(&key, value);
    }
    for tensor in &tensors {
        writer = writer.tensor_later(&tensor.name, &tensor.dims, tensor.quant.ggml_id(), tensor.bytes());
    }
    let mut written = 0;
    writer.write(out, |index, out| {
        let tensor = &tensors[index];
        // Each tensor from its own stream: a file's tensors do not depend on each other's.
        let mut rng = SplitMix::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        match &tensor.fill {
            Fill::Weights => write_random(tensor.quant, tensor.elements(), 0.0, WEIGHT_SIGMA, &mut rng, out)?,
            Fill::Norm => write_random(QuantType::F32, tensor.elements(), 1.0, 0.05, &mut rng, out)?,
            Fill::Bias => write_random(QuantType::F32, tensor.elements(), 0.0, WEIGHT_SIGMA, &mut rng, out)?,
            Fill::Values(values) => out.write_all(bytemuck::cast_slice(values))?,
        }
        written += tensor.bytes() as u64;
        progress(written, total as u64);
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests;
