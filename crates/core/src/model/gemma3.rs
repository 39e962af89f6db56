//! Gemma 3's text model (`gemma3`), as llama.cpp runs it.
//!
//! ```text
//! x = embed(tokens) * sqrt(hidden)
//! per layer (local: sliding window, rope base 10000; every 6th global: full causal, 1e6):
//!     h = rms_norm(x)
//!     q, k, v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ
//!     q, k = rms_norm per head
//!     q, k = rope(q), rope(k)
//!     cache[slots] = k, v
//!     x += rms_norm(attention(q, cache)·Woᵀ)                  (post-attention norm)
//!     h = rms_norm(x)
//!     x += rms_norm((gelu_tanh(h·Wgateᵀ) * h·Wupᵀ)·Wdownᵀ)    (post-FFN norm)
//! logits = rms_norm(x)·Eᵀ                                     (tied to the embedding E)
//! ```
//!
//! Each post-norm, its residual add and the next pre-norm run as one pass
//! ([`rms_norm_residual`]): the layer's attention input is normalised by the previous joint.
//! Dispatches a layer (decode): q/k/v in one stacked product, attention (which also normalises
//! and rotates the new token's q and k and stores its k and v), the output projection, the
//! joint, gate/up in one product, the down projection reading gelu(gate) * up, the joint: 7.
//!
//! Gemma's checkpoints scale by `1 + w` in every RMSNorm; llama.cpp's converter adds the 1 to
//! the weights it writes (the norms of gemma-3-270m's GGUF average 2 to 26, not 0 to 1), so
//! the GGUF weights scale as they are ([`NormWeight::Scale`]).

use crate::Result;
use crate::gpu::{Encoder, GpuContext, QuantMatrix, Tensor};
use crate::kernels::attention::{AttentionOptions, HeadNorms, HeadTransform, Projections};
use crate::kernels::elementwise::{GatedActivation, scale_in_place};
use crate::kernels::embedding::embedding;
use crate::kernels::matmul::{GatedInput, matmul, matmul_gated};
use crate::kernels::norm::{NormWeight, RmsNorm, rms_norm, rms_norm_residual};
use crate::kernels::rope::RopeConfig;
use crate::kv::KvCache;
use crate::model::Activations;
use crate::model::batch::Step;
use crate::model::config::{ModelConfig, RopeSettings};
use crate::model::weights::{Stacked, WeightLoader};

struct Layer {
    attn_norm: Tensor,
    /// The query, key and value projections.
    attn_qkv: Stacked,
    /// The per-head norms of the queries and keys, and the rotation (local or global).
    heads: HeadTransform,
    attn_output: QuantMatrix,
    post_attention_norm: Tensor,
    ffn_norm: Tensor,
    /// The gate and up projections.
    ffn_gate_up: Stacked,
    ffn_down: QuantMatrix,
    post_ffw_norm: Tensor,
    /// Sliding-window (local) attention, or global.
    local: bool,
}

/// The weights of a Gemma 3 model on the GPU.
pub(crate) struct Gemma3 {
    config: ModelConfig,
    token_embd: QuantMatrix,
    layers: Vec<Layer>,
    output_norm: Tensor,
    /// `None` when tied to the token embedding (as in every Gemma 3).
    output: Option<QuantMatrix>,
}

impl Gemma3 {
    /// Uploads the weights of a `gemma3` model.
    pub fn load(weights: &WeightLoader<'_>, config: &ModelConfig) -> Result<Self> {
        let ModelConfig { hidden, ffn, head_dim, .. } = *config;
        let (q_width, kv_width) = (config.n_heads * head_dim, config.n_kv_heads * head_dim);
        let rope = |settings: RopeSettings| RopeConfig {
            head_dim,
            rotated_dims: config.rope_dims,
            base: settings.base,
            freq_scale: settings.freq_scale,
            layout: config.rope_layout,
            freq_factors: None,
        };
        let (global_rope, local_rope) =
            (rope(config.rope), rope(config.sliding_window.map_or(config.rope, |swa| swa.rope)));
        let layers = (0..config.n_layers)
            .map(|i| {
                let name = |suffix: &str| format!("blk.{i}.{suffix}");
                let local = config.is_sliding_window_layer(i);
                let q_norm = weights.values_of(&name("attn_q_norm.weight"), head_dim)?;
                let k_norm = weights.values_of(&name("attn_k_norm.weight"), head_dim)?;
                let norms =
                    HeadNorms { q: &q_norm, k: &k_norm, convention: NormWeight::Scale, eps: config.rms_eps };
                let heads = HeadTransform::new(
                    weights.ctx,
                    if local { &local_rope } else { &global_rope },
                    Some(norms),
                )?;
                Ok(Layer {
                    attn_norm: weights.vector(&name("attn_norm.weight"), hidden)?,
                    attn_qkv: weights.stacked(
                        &[
                            (name("attn_q.weight"), q_width),
                            (name("attn_k.weight"), kv_width),
                            (name("attn_v.weight"), kv_width),
                        ],
                        hidden,
                    )?,
                    heads,
                    attn_output: weights.matrix(&name("attn_output.weight"), hidden, q_width)?,
                    post_attention_norm: weights.vector(&name("post_attention_norm.weight"), hidden)?,
                    ffn_norm: weights.vector(&name("ffn_norm.weight"), hidden)?,
                    ffn_gate_up: weights
                        .stacked(&[(name("ffn_gate.weight"), ffn), (name("ffn_up.weight"), ffn)], hidden)?,
                    ffn_down: weights.matrix(&name("ffn_down.weight"), hidden, ffn)?,
                    post_ffw_norm: weights.vector(&name("post_ffw_norm.weight"), hidden)?,
                    local,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Gemma3 {
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
        scale_in_place(ctx, encoder, &x, (self.config.hidden as f32).sqrt())?;
        let s = Activations::new(ctx, &self.config, step.n_tokens())?;
        let global =
            AttentionOptions { scale: self.config.attention_scale, sliding_window: None, softcap: None };
        let local = AttentionOptions {
            sliding_window: self.config.sliding_window.map(|swa| swa.window_tokens),
            ..global
        };
        if let Some(first) = self.layers.first() {
            rms_norm(ctx, encoder, &self.norm(&first.attn_norm), &x, &s.normed)?;
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let attention = if layer.local { &local } else { &global };

            // Self-attention of the normalised x, normalised after; then the FFN's input norm.
            layer.attn_qkv.forward(ctx, encoder, None, &s.normed, &[&s.q, &s.k, &s.v])?;
            let new = Projections { q: &s.q, k: &s.k, v: &s.v };
            step.attention(ctx, encoder, &layer.heads, &new, &cache.layer(i), attention, &s.attention)?;
            matmul(ctx, encoder, &layer.attn_output, &s.attention, &s.projected)?;
            let (post, ffn_norm) = (self.norm(&layer.post_attention_norm), self.norm(&layer.ffn_norm));
            rms_norm_residual(ctx, encoder, &post, &s.projected, &x, Some((&ffn_norm, &s.normed)))?;

            // Feed-forward (GeGLU), normalised after; then the next layer's input norm.
            layer.ffn_gate_up.forward(ctx, encoder, None, &s.normed, &[&s.gate, &s.up])?;
            let gated = GatedInput { activation: GatedActivation::GeluTanh, gate: &s.gate, up: &s.up };
            matmul_gated(ctx, encoder, &layer.ffn_down, &gated, &s.projected)?;
            let next_norm = self.layers.get(i + 1).map(|next| self.norm(&next.attn_norm));
            let next = next_norm.as_ref().map(|norm| (norm, &s.normed));
            rms_norm_residual(ctx, encoder, &self.norm(&layer.post_ffw_norm), &s.projected, &x, next)?;
        }
        let lm_head = self.output.as_ref().unwrap_or(&self.token_embd);
        step.logits(ctx, encoder, &x, &self.norm(&self.output_norm), lm_head)
    }
}
