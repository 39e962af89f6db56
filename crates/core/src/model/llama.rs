//! The llama family: Llama 2/3, Mistral, SmolLM (`llama`), Qwen 2 (`qwen2`: biases on q, k
//! and v) and Qwen 3 (`qwen3`: an RMSNorm on every query and key head before the rotation).
//!
//! ```text
//! x = embed(tokens)
//! per layer:
//!     h = rms_norm(x)
//!     q, k, v = h·Wqᵀ (+ bq), h·Wkᵀ (+ bk), h·Wvᵀ (+ bv)      (one pass where the types agree)
//!     q, k = rms_norm per head (qwen3)
//!     q, k = rope(q), rope(k);  cache[slots] = k, v
//!     x += attention(q, cache)·Woᵀ
//!     h = rms_norm(x)
//!     x += (silu(h·Wgateᵀ) * h·Wupᵀ)·Wdownᵀ
//! logits = rms_norm(x)·Woutputᵀ       (Woutput = the embedding when the file has none)
//! ```
//!
//! Dispatches a layer (llama, decode): q/k/v in one stacked product of the normalised x (the
//! product normalises x as it loads it), attention (which also normalises and rotates the new
//! token's q and k and stores its k and v), the output projection adding into x, gate/up in one
//! product of the normalised x, and the down projection reading silu(gate) * up and adding into
//! x: 5. A prefill step norms, rotates and stores in passes of their own first.

use crate::Result;
use crate::gpu::{Encoder, GpuContext, QuantMatrix, Tensor};
use crate::kernels::attention::{AttentionOptions, HeadNorms, HeadTransform, Projections};
use crate::kernels::elementwise::{GatedActivation, add_bias_in_place};
use crate::kernels::embedding::embedding;
use crate::kernels::matmul::{GatedInput, MatmulInput, MatmulOutput, matmul};
use crate::kernels::norm::{NormWeight, RmsNorm};
use crate::kernels::rope::RopeConfig;
use crate::kv::KvCache;
use crate::model::Activations;
use crate::model::batch::Step;
use crate::model::config::{Architecture, ModelConfig};
use crate::model::weights::{Stacked, WeightLoader};

struct Layer {
    attn_norm: Tensor,
    /// The query, key and value projections.
    qkv: Stacked,
    /// Qwen 2's biases of the query, key and value projections.
    qkv_bias: Option<[Tensor; 3]>,
    /// Qwen 3's per-head norms of the queries and keys, and the rotation.
    heads: HeadTransform,
    attn_output: QuantMatrix,
    ffn_norm: Tensor,
    /// The gate and up projections.
    ffn_gate_up: Stacked,
    ffn_down: QuantMatrix,
}

/// The weights of a llama-family model on the GPU.
pub(crate) struct Llama {
    config: ModelConfig,
    token_embd: QuantMatrix,
    layers: Vec<Layer>,
    output_norm: Tensor,
    /// `None` when tied to the token embedding.
    output: Option<QuantMatrix>,
}

impl Llama {
    /// Uploads the weights of a `llama`, `qwen2` or `qwen3` model.
    pub fn load(weights: &WeightLoader<'_>, config: &ModelConfig) -> Result<Self> {
        let ModelConfig { hidden, ffn, head_dim, .. } = *config;
        let (q_width, kv_width) = (config.n_heads * head_dim, config.n_kv_heads * head_dim);
        let qkv_bias = config.architecture == Architecture::Qwen2;
        let head_norms = config.architecture == Architecture::Qwen3;
        // Llama 3.1+ divides each rotated pair's frequency by a factor from the file.
        let freq_factors = weights.optional_values("rope_freqs.weight", config.rope_dims / 2)?;
        let rope = RopeConfig {
            head_dim,
            rotated_dims: config.rope_dims,
            base: config.rope.base,
            freq_scale: config.rope.freq_scale,
            layout: config.rope_layout,
            freq_factors: freq_factors.as_deref(),
        };
        let layers = (0..config.n_layers)
            .map(|i| {
                let name = |suffix: &str| format!("blk.{i}.{suffix}");
                let head_norm = |suffix: &str| weights.values_of(&name(suffix), head_dim);
                let norms = if head_norms {
                    Some((head_norm("attn_q_norm.weight")?, head_norm("attn_k_norm.weight")?))
                } else {
                    None
                };
                let norms = norms.as_ref().map(|(q, k)| HeadNorms {
                    q,
                    k,
                    convention: NormWeight::Scale,
                    eps: config.rms_eps,
                });
                let qkv = [("attn_q", q_width), ("attn_k", kv_width), ("attn_v", kv_width)];
                let bias = |(projection, rows): (&str, usize)| {
                    weights.vector(&name(&format!("{projection}.bias")), rows)
                };
                Ok(Layer {
                    attn_norm: weights.vector(&name("attn_norm.weight"), hidden)?,
                    qkv: weights
                        .stacked(&qkv.map(|(p, rows)| (name(&format!("{p}.weight")), rows)), hidden)?,
                    qkv_bias: if qkv_bias {
                        Some([bias(qkv[0])?, bias(qkv[1])?, bias(qkv[2])?])
                    } else {
                        None
                    },
                    heads: HeadTransform::new(weights.ctx, &rope, norms)?,
                    attn_output: weights.matrix(&name("attn_output.weight"), hidden, q_width)?,
                    ffn_norm: weights.vector(&name("ffn_norm.weight"), hidden)?,
                    ffn_gate_up: weights
                        .stacked(&[(name("ffn_gate.weight"), ffn), (name("ffn_up.weight"), ffn)], hidden)?,
                    ffn_down: weights.matrix(&name("ffn_down.weight"), hidden, ffn)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Llama {
            config: config.clone(),
            token_embd: weights.matrix("token_embd.weight", config.vocab_size, hidden)?,
            layers,
            output_norm: weights.vector("output_norm.weight", hidden)?,
            output: (!config.tied_output)
                .then(|| weights.matrix("output.weight", config.vocab_size, hidden))
                .transpose()?,
        })
    }

    fn norm<'a>(&self, weight: &'a Tensor) -> RmsNorm<'a> {
        RmsNorm { weight, convention: NormWeight::Scale, eps: self.config.rms_eps }
    }

    /// Records the forward pass of `step`; returns the logits of its selected rows.
    pub fn forward(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        step: &Step,
        cache: &KvCache,
    ) -> Result<Tensor> {
        let x = Tensor::empty(ctx, "hidden", &[step.n_tokens(), self.config.hidden])?;
        embedding(ctx, encoder, &self.token_embd, &step.token_ids, &x)?;
        let s = Activations::new(ctx, &self.config, step.n_tokens())?;
        let attention =
            AttentionOptions { scale: self.config.attention_scale, sliding_window: None, softcap: None };
        let dispatches_before_layers = ctx.dispatch_count();
        for (i, layer) in self.layers.iter().enumerate() {
            // Self-attention.
            let input = MatmulInput::Normed(&x, self.norm(&layer.attn_norm));
            layer.qkv.forward(ctx, encoder, input, &[&s.q, &s.k, &s.v])?;
            if let Some(biases) = &layer.qkv_bias {
                for (out, bias) in [&s.q, &s.k, &s.v].into_iter().zip(biases) {
                    add_bias_in_place(ctx, encoder, out, bias)?;
                }
            }
            let new = Projections { q: &s.q, k: &s.k, v: &s.v };
            step.attention(ctx, encoder, &layer.heads, &new, &cache.layer(i), &attention, &s.attention)?;
            let (input, output) = (MatmulInput::Plain(&s.attention), MatmulOutput::AddTo(&x));
            matmul(ctx, encoder, &layer.attn_output, input, output)?;

            // Feed-forward (SwiGLU).
            let input = MatmulInput::Normed(&x, self.norm(&layer.ffn_norm));
            layer.ffn_gate_up.forward(ctx, encoder, input, &[&s.gate, &s.up])?;
            let gated = GatedInput { activation: GatedActivation::Silu, gate: &s.gate, up: &s.up };
            matmul(ctx, encoder, &layer.ffn_down, MatmulInput::Gated(gated), MatmulOutput::AddTo(&x))?;
        }
        ctx.count_layer_dispatches(ctx.dispatch_count() - dispatches_before_layers);
        let lm_head = self.output.as_ref().unwrap_or(&self.token_embd);
        step.logits(ctx, encoder, &x, &self.norm(&self.output_norm), lm_head)
    }
}
