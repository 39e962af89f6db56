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
//! Each post-norm, its residual add and the next pre-norm (a joint) run inside the next
//! product, which loads its input as `pre_norm(x + post_norm(sublayer))` and stores the new x
//! ([`ResidualInput`]; x alternates between two tensors, as a product may not overwrite what
//! other workgroups of it still read), or, where [`tuning::fuses_residual_input`] says that costs more
//! than a pass of its own, as one pass before it ([`rms_norm_residual`]). Dispatches a layer
//! (decode): q/k/v in one stacked product, attention (which also normalises and rotates the
//! new token's q and k and stores its k and v), the output projection, gate/up in one product,
//! the down projection reading gelu(gate) * up: 5, and 2 joints where they are passes. The last
//! layer's joint is always a pass, before the output norm.
//!
//! Gemma's checkpoints scale by `1 + w` in every RMSNorm; llama.cpp's converter adds the 1 to
//! the weights it writes (the norms of gemma-3-270m's GGUF average 2 to 26, not 0 to 1), so
//! the GGUF weights scale as they are ([`NormWeight::Scale`]).

use crate::Result;
use crate::gpu::{Encoder, GpuContext, QuantMatrix, Tensor};
use crate::kernels::attention::{AttentionOptions, HeadNorms, HeadTransform, Projections};
use crate::kernels::elementwise::{GatedActivation, scale_in_place};
use crate::kernels::embedding::embedding;
use crate::kernels::matmul::{GatedInput, MatmulInput, MatmulOutput, ResidualInput, matmul};
use crate::kernels::norm::{NormWeight, RmsNorm, rms_norm_residual};
use crate::kernels::rope::RopeConfig;
use crate::kv::KvCache;
use crate::model::Activations;
use crate::model::batch::Step;
use crate::model::config::{ModelConfig, RopeSettings};
use crate::model::weights::{Stacked, WeightLoader};
use crate::tuning;

/// The norms at a joint of the residual stream: the post-norm of the sublayer before it and
/// the pre-norm of the sublayer after it.
struct JointNorms {
    post: Tensor,
    pre: Tensor,
    /// The pre-norm's weight, then the post-norm's (`[2, hidden]`, as [`ResidualInput`] takes
    /// them).
    both: Tensor,
}

impl JointNorms {
    fn load(weights: &WeightLoader<'_>, post: &str, pre: &str, hidden: usize) -> Result<Self> {
        let (post_values, pre_values) = (weights.values_of(post, hidden)?, weights.values_of(pre, hidden)?);
        let ctx = weights.ctx;
        Ok(JointNorms {
            post: Tensor::from_slice(ctx, post, &[hidden], &post_values)?,
            pre: Tensor::from_slice(ctx, pre, &[hidden], &pre_values)?,
            both: Tensor::from_slice(ctx, pre, &[2, hidden], &[pre_values, post_values].concat())?,
        })
    }
}

struct Layer {
    attn_norm: Tensor,
    /// After the first layer: the previous layer's post-FFN norm and this one's attention norm.
    attn_joint: Option<JointNorms>,
    /// The query, key and value projections.
    attn_qkv: Stacked,
    /// The per-head norms of the queries and keys, and the rotation (local or global).
    heads: HeadTransform,
    attn_output: QuantMatrix,
    /// The post-attention norm and the FFN norm.
    ffn_joint: JointNorms,
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
                let attn_joint = i
                    .checked_sub(1)
                    .map(|previous| {
                        let post = format!("blk.{previous}.post_ffw_norm.weight");
                        JointNorms::load(weights, &post, &name("attn_norm.weight"), hidden)
                    })
                    .transpose()?;
                let ffn_joint = JointNorms::load(
                    weights,
                    &name("post_attention_norm.weight"),
                    &name("ffn_norm.weight"),
                    hidden,
                )?;
                Ok(Layer {
                    attn_norm: weights.vector(&name("attn_norm.weight"), hidden)?,
                    attn_joint,
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
                    ffn_joint,
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

    /// Records the joint of the residual stream `streams[*x]` with `sublayer` across `norms`,
    /// and returns the next products' input: the joint inside them (the new stream going to
    /// the other tensor, which `x` then names), or, unless `fused`, a pass of its own that
    /// updates the stream in place and normalises it into `normed`.
    #[allow(clippy::too_many_arguments)]
    fn join<'a>(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        fused: bool,
        streams: &'a [Tensor; 2],
        x: &mut usize,
        sublayer: &'a Tensor,
        norms: &'a JointNorms,
        normed: &'a Tensor,
    ) -> Result<MatmulInput<'a>> {
        if !fused {
            let next = (&self.norm(&norms.pre), normed);
            rms_norm_residual(ctx, encoder, &self.norm(&norms.post), sublayer, &streams[*x], Some(next))?;
            return Ok(MatmulInput::Plain(normed));
        }
        let residual = &streams[*x];
        *x = 1 - *x;
        Ok(MatmulInput::Residual(ResidualInput {
            residual,
            sublayer,
            norm_weights: &norms.both,
            convention: NormWeight::Scale,
            eps: self.config.rms_eps,
            sum: &streams[*x],
        }))
    }

    /// Records the forward pass of `step`; returns the logits of its selected rows.
    pub fn forward(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        step: &Step,
        cache: &KvCache,
    ) -> Result<Tensor> {
        let shape = [step.n_tokens(), self.config.hidden];
        // The residual stream, in turns where the joints are inside products.
        let streams = [Tensor::empty(ctx, "hidden", &shape)?, Tensor::empty(ctx, "hidden", &shape)?];
        let mut x = 0;
        embedding(ctx, encoder, &self.token_embd, &step.token_ids, &streams[x])?;
        scale_in_place(ctx, encoder, &streams[x], (self.config.hidden as f32).sqrt())?;
        let s = Activations::new(ctx, &self.config, step.n_tokens())?;
        let fused = tuning::fuses_residual_input(ctx.device_class(), step.n_tokens());
        let global =
            AttentionOptions { scale: self.config.attention_scale, sliding_window: None, softcap: None };
        let local = AttentionOptions {
            sliding_window: self.config.sliding_window.map(|swa| swa.window_tokens),
            ..global
        };
        let dispatches_before_layers = ctx.dispatch_count();
        for (i, layer) in self.layers.iter().enumerate() {
            let attention = if layer.local { &local } else { &global };

            // Self-attention of the normalised x (joined with the previous layer's FFN first).
            let input = match &layer.attn_joint {
                None => MatmulInput::Normed(&streams[x], self.norm(&layer.attn_norm)),
                Some(joint) => {
                    self.join(ctx, encoder, fused, &streams, &mut x, &s.projected, joint, &s.normed)?
                }
            };
            layer.attn_qkv.forward(ctx, encoder, input, &[&s.q, &s.k, &s.v])?;
            let new = Projections { q: &s.q, k: &s.k, v: &s.v };
            step.attention(ctx, encoder, &layer.heads, &new, &cache.layer(i), attention, &s.attention)?;
            let (input, output) = (MatmulInput::Plain(&s.attention), MatmulOutput::Write(&s.projected));
            matmul(ctx, encoder, &layer.attn_output, input, output)?;

            // Feed-forward (GeGLU) of the normalised x, joined with the attention's output first.
            let joint = &layer.ffn_joint;
            let input = self.join(ctx, encoder, fused, &streams, &mut x, &s.projected, joint, &s.normed)?;
            layer.ffn_gate_up.forward(ctx, encoder, input, &[&s.gate, &s.up])?;
            let gated = GatedInput { activation: GatedActivation::GeluTanh, gate: &s.gate, up: &s.up };
            matmul(
                ctx,
                encoder,
                &layer.ffn_down,
                MatmulInput::Gated(gated),
                MatmulOutput::Write(&s.projected),
            )?;
        }
        ctx.count_layer_dispatches(ctx.dispatch_count() - dispatches_before_layers);
        if let Some(last) = self.layers.last() {
            rms_norm_residual(
                ctx,
                encoder,
                &self.norm(&last.post_ffw_norm),
                &s.projected,
                &streams[x],
                None,
            )?;
        }
        let lm_head = self.output.as_ref().unwrap_or(&self.token_embd);
        step.logits(ctx, encoder, &streams[x], &self.norm(&self.output_norm), lm_head)
    }
}
