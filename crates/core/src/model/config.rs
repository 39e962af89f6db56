//! [`ModelConfig`]: a model's hyper-parameters, read from its GGUF metadata in one place.
//!
//! The rules follow llama.cpp's loader (`llama-model.cpp`, `llama-hparams.cpp`): where it
//! derives a value (head size, rope type, Gemma 3's layer pattern), this module derives it the
//! same way.

use crate::gguf::{GgufFile, Metadata};
use crate::kernels::rope::RopeLayout;
use crate::{Error, Result};

/// The model architectures flint runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `llama`: Llama 2/3, Mistral, SmolLM ...
    Llama,
    /// `qwen2`: llama with biases on the q, k and v projections.
    Qwen2,
    /// `qwen3`: llama with an RMSNorm on each query and key head.
    Qwen3,
    /// `gemma3`: Gemma 3's text model.
    Gemma3,
}

impl Architecture {
    /// Every supported architecture.
    pub const ALL: [Architecture; 4] =
        [Architecture::Llama, Architecture::Qwen2, Architecture::Qwen3, Architecture::Gemma3];

    /// The `general.architecture` value, also the prefix of the architecture's metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// The architecture named `name`, or an error that names it and lists the supported ones.
    pub fn from_name(name: &str) -> Result<Self> {
        Architecture::ALL.into_iter().find(|arch| arch.name() == name).ok_or_else(|| Error::Gguf {
            context: "metadata key 'general.architecture'".into(),
            reason: format!(
                "architecture '{name}' is not supported; flint runs {}",
                Architecture::ALL.map(Architecture::name).join(", ")
            ),
        })
    }

    /// llama.cpp's rope type for the architecture (`llama_model_rope_type`): the "normal"
    /// interleaved pairs for llama, whose converter permutes q and k to fit; NeoX halves for the
    /// others.
    fn rope_layout(self) -> RopeLayout {
        match self {
            Architecture::Llama => RopeLayout::Interleaved,
            Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Gemma3 => RopeLayout::NeoX,
        }
    }
}

/// The rotary embedding of one kind of attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSettings {
    /// Frequency base.
    pub base: f32,
    /// Position multiplier (1 for none; the inverse of a linear scaling factor).
    pub freq_scale: f32,
}

/// Gemma 3's local layers: sliding-window attention with their own rope base, interleaved with
/// global layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindowLayers {
    /// Keys visible to a query: the last `window_tokens` positions, its own included
    /// (`{arch}.attention.sliding_window`).
    pub window_tokens: u32,
    /// The pattern repeats every `period_layers` layers, whose last one is global (llama.cpp's
    /// `set_swa_pattern(6)` for Gemma 3: layers 5, 11, 17 ... are global).
    pub period_layers: usize,
    /// The rotary embedding of the local layers (base 10000 unscaled, unless the file has
    /// `{arch}.rope.freq_base_swa`).
    pub rope: RopeSettings,
}

/// A model's hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Which forward pass runs.
    pub architecture: Architecture,
    /// Transformer layers (`block_count`).
    pub n_layers: usize,
    /// Width of the residual stream (`embedding_length`).
    pub hidden: usize,
    /// Width of the feed-forward block's hidden layer (`feed_forward_length`).
    pub ffn: usize,
    /// Query heads (`attention.head_count`).
    pub n_heads: usize,
    /// Key/value heads (`attention.head_count_kv`, default `n_heads`).
    pub n_kv_heads: usize,
    /// Elements per head (`attention.key_length`, default `hidden / n_heads`); values have the
    /// same width.
    pub head_dim: usize,
    /// RMSNorm epsilon (`attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Leading dims of each head that rotate (`rope.dimension_count`, default `head_dim`).
    pub rope_dims: usize,
    /// Which dims pair up in the rotation (from the architecture, as llama.cpp decides it).
    pub rope_layout: RopeLayout,
    /// The rotary embedding of the (global) attention layers (`rope.freq_base`, default 10000;
    /// `rope.scaling.*`).
    pub rope: RopeSettings,
    /// Scores are `q · k * attention_scale`.
    pub attention_scale: f32,
    /// Gemma 3's sliding-window layers, when the file has a window.
    pub sliding_window: Option<SlidingWindowLayers>,
    /// The longest context the model was trained for, in tokens (`context_length`).
    pub context_length: usize,
    /// Rows of the token embedding: the width of the logits.
    pub vocab_size: usize,
    /// The output projection is the token embedding (the file has no `output.weight`).
    pub tied_output: bool,
    /// How an input's hidden states become its embedding (`pooling_type`).
    pub pooling: Pooling,
}

/// How the final hidden states of an input's tokens become one embedding: the `pooling_type`
/// of the file, numbered as llama.cpp numbers it (0 none, 1 mean, 2 cls, 3 last, 4 rank). A
/// file without one, or with none, pools by the mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token (`pooling_type` 1; also 0 and absent).
    Mean,
    /// The first token's (`pooling_type` 2, "cls").
    First,
    /// The last token's (`pooling_type` 3), as Qwen3-Embedding pools.
    Last,
}

impl ModelConfig {
    /// Reads the hyper-parameters of `file`'s model; an error names the key that is missing or
    /// wrong, or the architecture that is not supported.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let metadata = file.metadata();
        let architecture = Architecture::from_name(metadata.get_str("general.architecture")?)?;
        let arch = architecture.name();
        let key = |name: &str| format!("{arch}.{name}");
        let count = |name: &str| -> Result<usize> { positive(metadata, &key(name)) };
        let optional_count = |name: &str| -> Result<Option<usize>> {
            metadata.get(&key(name)).map(|_| positive(metadata, &key(name))).transpose()
        };

        let n_layers = count("block_count")?;
        let hidden = count("embedding_length")?;
        let ffn = count("feed_forward_length")?;
        let n_heads = count("attention.head_count")?;
        let n_kv_heads = optional_count("attention.head_count_kv")?.unwrap_or(n_heads);
        if !n_heads.is_multiple_of(n_kv_heads) {
            return Err(key_error(
                &key("attention.head_count_kv"),
                format!("{n_kv_heads} kv heads do not divide the {n_heads} query heads"),
            ));
        }
        let head_dim = match optional_count("attention.key_length")? {
            Some(head_dim) => head_dim,
            None if hidden.is_multiple_of(n_heads) => hidden / n_heads,
            None => {
                return Err(key_error(
                    &key("attention.key_length"),
                    format!(
                        "missing, and embedding_length {hidden} is not a multiple of head_count {n_heads}"
                    ),
                ));
            }
        };
        if let Some(value_dim) = optional_count("attention.value_length")?
            && value_dim != head_dim
        {
            return Err(key_error(
                &key("attention.value_length"),
                format!("{value_dim} differs from the key length {head_dim}; flint needs them equal"),
            ));
        }
        let rms_eps: f32 = metadata.require(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_dims = optional_count("rope.dimension_count")?.unwrap_or(head_dim);
        let rope = RopeSettings {
            base: metadata.optional(&key("rope.freq_base"))?.unwrap_or(10000.0),
            freq_scale: rope_freq_scale(metadata, arch)?,
        };
        let context_length = count("context_length")?;

        let embedding = file.tensor("token_embd.weight").ok_or_else(|| Error::Gguf {
            context: "tensor 'token_embd.weight'".into(),
            reason: "missing: every model needs its token embedding".into(),
        })?;
        let vocab_size = embedding.rows();

        let (sliding_window, attention_scale) = match architecture {
            Architecture::Gemma3 => gemma3_attention(metadata, n_layers, hidden, n_heads, head_dim)?,
            _ => (None, 1.0 / (head_dim as f32).sqrt()),
        };
        if let Some(softcap) = metadata.optional::<f32>(&key("final_logit_softcapping"))?
            && softcap != 0.0
        {
            return Err(key_error(
                &key("final_logit_softcapping"),
                format!("a final logit soft-cap ({softcap}) is not supported"),
            ));
        }

        let pooling = match metadata.optional::<u32>(&key("pooling_type"))? {
            None | Some(0 | 1) => Pooling::Mean,
            Some(2) => Pooling::First,
            Some(3) => Pooling::Last,
            Some(other) => {
                return Err(key_error(
                    &key("pooling_type"),
                    format!(
                        "{other} (rank, or unknown) is not supported: flint pools by mean, first or last token"
                    ),
                ));
            }
        };

        Ok(ModelConfig {
            architecture,
            n_layers,
            hidden,
            ffn,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_eps,
            rope_dims,
            rope_layout: architecture.rope_layout(),
            rope,
            attention_scale,
            sliding_window,
            context_length,
            vocab_size,
            tied_output: file.tensor("output.weight").is_none(),
            pooling,
        })
    }

    /// Whether layer `layer` attends through the sliding window (a local layer of Gemma 3).
    pub fn is_sliding_window_layer(&self, layer: usize) -> bool {
        self.sliding_window.is_some_and(|swa| layer % swa.period_layers != swa.period_layers - 1)
    }
}

fn key_error(key: &str, reason: String) -> Error {
    Error::Gguf { context: format!("metadata key '{key}'"), reason }
}

/// A required count that must be at least 1.
fn positive(metadata: &Metadata, key: &str) -> Result<usize> {
    match metadata.require::<usize>(key)? {
        0 => Err(key_error(key, "is 0; it must be at least 1".into())),
        n => Ok(n),
    }
}

/// The rope position multiplier from `{arch}.rope.scaling.type` and `.factor` (or the older
/// `{arch}.rope.scale_linear`): linear scaling divides positions by the factor; other kinds
/// (YaRN, LongRoPE) are not supported.
fn rope_freq_scale(metadata: &Metadata, arch: &str) -> Result<f32> {
    let type_key = format!("{arch}.rope.scaling.type");
    let factor_key = format!("{arch}.rope.scaling.factor");
    let factor = match metadata.optional::<&str>(&type_key)? {
        None | Some("none") => metadata.optional::<f32>(&format!("{arch}.rope.scale_linear"))?,
        Some("linear") => metadata.optional::<f32>(&factor_key)?,
        Some(other) => {
            return Err(key_error(
                &type_key,
                format!("rope scaling '{other}' is not supported (only linear)"),
            ));
        }
    };
    match factor {
        None => Ok(1.0),
        Some(factor) if factor.is_finite() && factor > 0.0 => Ok(1.0 / factor),
        Some(factor) => Err(key_error(&factor_key, format!("{factor} must be finite and positive"))),
    }
}

/// Gemma 3's sliding-window layers and attention scale, by llama.cpp's rules: with a window,
/// every 6th layer is global and the others local with rope base 10000; queries are scaled by
/// `1 / sqrt(query_pre_attn_scalar)`, which is the head size except for the 27B model (62
/// layers), whose scalar is `hidden / n_heads`.
fn gemma3_attention(
    metadata: &Metadata,
    n_layers: usize,
    hidden: usize,
    n_heads: usize,
    head_dim: usize,
) -> Result<(Option<SlidingWindowLayers>, f32)> {
    const PERIOD_LAYERS: usize = 6;
    const LOCAL_ROPE_BASE: f32 = 10000.0;
    const LAYERS_OF_27B: usize = 62;
    let window: Option<u32> = metadata.optional("gemma3.attention.sliding_window")?;
    let sliding_window = match window {
        None | Some(0) => None,
        Some(window_tokens) => Some(SlidingWindowLayers {
            window_tokens,
            period_layers: PERIOD_LAYERS,
            rope: RopeSettings {
                base: metadata.optional("gemma3.rope.freq_base_swa")?.unwrap_or(LOCAL_ROPE_BASE),
                freq_scale: 1.0,
            },
        }),
    };
    let query_pre_attn_scalar = if n_layers == LAYERS_OF_27B { hidden / n_heads } else { head_dim };
    Ok((sliding_window, 1.0 / (query_pre_attn_scalar as f32).sqrt()))
}
