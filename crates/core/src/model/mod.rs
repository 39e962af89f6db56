//! Model architectures as forward passes over the kernel library: [`Model`] loads a GGUF
//! model's weights onto the GPU (still quantized) and runs batches of tokens of one or more
//! sequences against a paged [`KvCache`], returning logits.
//!
//! One file per architecture family: `llama.rs` (llama, qwen2, qwen3) and `gemma3.rs`; their
//! hyper-parameters come from [`ModelConfig::from_gguf`].
//!
//! ```no_run
//! # async fn example() -> flint_core::Result<()> {
//! use flint_core::gguf::GgufFile;
//! use flint_core::gpu::{GpuContext, GpuOptions};
//! use flint_core::model::{LogitRows, Model, SequenceChunk};
//!
//! let ctx = GpuContext::new(&GpuOptions::default()).await?;
//! let model = Model::load(ctx.clone(), &GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?)?;
//! let mut cache = model.new_kv_cache(Some(1024))?;
//! let mut sequence = cache.new_sequence();
//!
//! // Prefill the prompt: logits of its last token only.
//! let prompt = [504, 3575, 282, 4649, 314];
//! cache.append(&mut sequence, prompt.len())?;
//! let chunk = SequenceChunk { table: &sequence, tokens: &prompt, first_position: 0, logits: LogitRows::Last };
//! let logits = model.forward(&cache, &[chunk])?.to_f32(&ctx).await?;
//! let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
//!
//! // One decode step.
//! let position = cache.append(&mut sequence, 1)?.start;
//! let chunk = SequenceChunk { table: &sequence, tokens: &[next], first_position: position, logits: LogitRows::Last };
//! let logits = model.forward(&cache, &[chunk])?.to_f32(&ctx).await?;
//! cache.release(sequence);
//! # Ok(())
//! # }
//! ```

mod batch;
mod config;
mod gemma3;
mod llama;
mod plan;
mod weights;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use batch::{GpuTokens, LogitRows, SequenceChunk};
pub use config::{Architecture, ModelConfig, Pooling, RopeSettings, SlidingWindowLayers};
pub use plan::{MemoryPlan, MemorySource, PlanRequest, UNKNOWN_MEMORY_KV_BYTES};
pub use weights::{WeightUpload, tensors_read_first};

use crate::gguf::GgufFile;
use crate::gpu::{BindGroupCache, Encoder, GpuContext, Tensor};
use crate::kv::{KvCache, KvCacheShape};
use crate::{Error, Result};

/// Tokens per block of the KV caches that [`Model::new_kv_cache`] creates.
pub const KV_BLOCK_TOKENS: usize = 16;

/// The weights of one architecture.
enum Network {
    Llama(llama::Llama),
    Gemma3(gemma3::Gemma3),
}

/// A model on the GPU, ready to run forward passes.
pub struct Model {
    ctx: Arc<GpuContext>,
    config: ModelConfig,
    network: Network,
    /// The bind groups of recent passes, found again by the next ones.
    bind_groups: Arc<BindGroupCache>,
}

impl Model {
    /// Reads `file`'s hyper-parameters and uploads its weights. An error names what is missing,
    /// malformed or unsupported: the architecture, a metadata key, a tensor or its type.
    pub fn load(ctx: Arc<GpuContext>, file: &GgufFile) -> Result<Self> {
        let mut upload = Model::begin_load(ctx, file)?;
        upload.write_from(file)?;
        upload.finish()
    }

    /// Reads `file`'s hyper-parameters and vectors ([`tensors_read_first`]) and allocates its
    /// matrices; the [`WeightUpload`] then writes them as their bytes come. `file` may be
    /// opened from its header ([`GgufFile::from_header`]) with only the vectors' bytes.
    pub fn begin_load(ctx: Arc<GpuContext>, file: &GgufFile) -> Result<WeightUpload> {
        let config = ModelConfig::from_gguf(file)?;
        let weights = weights::WeightLoader::new(&ctx, file, config.architecture.name());
        let network = match config.architecture {
            Architecture::Llama | Architecture::Qwen2 | Architecture::Qwen3 => {
                Network::Llama(llama::Llama::load(&weights, &config)?)
            }
            Architecture::Gemma3 => Network::Gemma3(gemma3::Gemma3::load(&weights, &config)?),
        };
        let model = Model { ctx: ctx.clone(), config, network, bind_groups: Arc::default() };
        Ok(weights.into_upload(model))
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The GPU the model lives on.
    pub fn gpu(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// The shape of one token's keys and values in this model's KV cache.
    pub fn kv_cache_shape(&self) -> KvCacheShape {
        KvCacheShape {
            layers: self.config.n_layers,
            kv_heads: self.config.n_kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// A KV cache for this model with room for `capacity_tokens` tokens over all sequences, or
    /// by default the model's context length, capped at what one storage binding holds per
    /// layer. Blocks are [`KV_BLOCK_TOKENS`] tokens.
    pub fn new_kv_cache(&self, capacity_tokens: Option<usize>) -> Result<KvCache> {
        // The bind groups kept so far may hold an older cache's buffers alive.
        self.forget_bind_groups();
        let shape = self.kv_cache_shape();
        let tokens = capacity_tokens.unwrap_or_else(|| {
            let fitting =
                shape.max_tokens(self.ctx.max_binding_bytes(), KV_BLOCK_TOKENS).max(KV_BLOCK_TOKENS);
            self.config.context_length.min(fitting)
        });
        KvCache::new(&self.ctx, shape, KV_BLOCK_TOKENS, tokens)
    }

    /// Drops the bind groups kept from earlier passes, and with them the buffers they hold
    /// alive: for a caller about to leave the model idle (the next pass makes them again).
    pub fn forget_bind_groups(&self) {
        self.bind_groups.clear();
    }

    /// The most rows of logits one forward pass can return: the logits tensor must fit one
    /// storage binding.
    pub fn max_logit_rows(&self) -> usize {
        (self.ctx.max_binding_bytes() / (self.config.vocab_size as u64 * 4)) as usize
    }

    /// Runs one forward pass over a batch of chunks of one or more sequences, recorded into one
    /// command buffer and submitted once; returns the logits `[n_rows, vocab_size]` of the rows
    /// the chunks ask for, in chunk order, for the caller to read back.
    ///
    /// Each chunk's positions must be reserved in its block table ([`KvCache::append`]); the
    /// pass writes their keys and values into `cache` and attends to everything before them.
    /// A prompt may come in one chunk or in several passes (chunked prefill); a decode step is
    /// a chunk of one token. At most [`Model::max_logit_rows`] rows may ask for logits.
    pub fn forward(&self, cache: &KvCache, chunks: &[SequenceChunk<'_>]) -> Result<Tensor> {
        Ok(self.forward_then(cache, chunks, None, |_, _, _| Ok(()))?.0)
    }

    /// [`Model::forward`], with some token ids taken from the GPU (`gpu_tokens`: tokens an
    /// earlier pass sampled, not read back) and more work recorded after the pass into the
    /// same command buffer: `then` gets the logits (the engine finds each row's most likely
    /// tokens there, so that it reads back a few candidates instead of whole rows).
    pub fn forward_then<T>(
        &self,
        cache: &KvCache,
        chunks: &[SequenceChunk<'_>],
        gpu_tokens: Option<GpuTokens<'_>>,
        then: impl FnOnce(&GpuContext, &mut Encoder, &Tensor) -> Result<T>,
    ) -> Result<(Tensor, T)> {
        let step = self.step(cache, chunks)?;
        self.run_pass(cache, step, gpu_tokens, then)
    }

    /// [`Model::forward`] that stops before the output projection: the final hidden states,
    /// normalised by the output norm, `[n_rows, hidden]` of the rows the chunks ask for (the
    /// states embeddings are pooled from).
    pub fn forward_hidden(&self, cache: &KvCache, chunks: &[SequenceChunk<'_>]) -> Result<Tensor> {
        let step = self.step(cache, chunks)?.with_hidden_output();
        Ok(self.run_pass(cache, step, None, |_, _, _| Ok(()))?.0)
    }

    /// The checked, uploaded inputs of a pass over `chunks`.
    fn step(&self, cache: &KvCache, chunks: &[SequenceChunk<'_>]) -> Result<batch::Step> {
        if cache.shape() != self.kv_cache_shape() {
            return Err(Error::InvalidBatch(format!(
                "the KV cache holds {:?} per token, but this model needs {:?}",
                cache.shape(),
                self.kv_cache_shape()
            )));
        }
        batch::Step::new(&self.ctx, self.config.vocab_size, cache, chunks)
    }

    /// Records and submits the pass of `step`, then `then`'s work on its output.
    fn run_pass<T>(
        &self,
        cache: &KvCache,
        step: batch::Step,
        gpu_tokens: Option<GpuTokens<'_>>,
        then: impl FnOnce(&GpuContext, &mut Encoder, &Tensor) -> Result<T>,
    ) -> Result<(Tensor, T)> {
        let ctx = &*self.ctx;
        let mut encoder = ctx.encoder("forward");
        encoder.keep_bind_groups(Arc::clone(&self.bind_groups));
        if let Some(gpu_tokens) = &gpu_tokens {
            step.take_gpu_tokens(&mut encoder, gpu_tokens)?;
        }
        let output = match &self.network {
            Network::Llama(model) => model.forward(ctx, &mut encoder, &step, cache)?,
            Network::Gemma3(model) => model.forward(ctx, &mut encoder, &step, cache)?,
        };
        let after = then(ctx, &mut encoder, &output)?;
        ctx.submit(encoder)?;
        Ok((output, after))
    }
}

/// Activations of one forward pass `[n_tokens, width]`, reused by every layer.
struct Activations {
    normed: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attention: Tensor,
    projected: Tensor,
    gate: Tensor,
    up: Tensor,
}

impl Activations {
    fn new(ctx: &GpuContext, config: &ModelConfig, n_tokens: usize) -> Result<Self> {
        let q_width = config.n_heads * config.head_dim;
        let kv_width = config.n_kv_heads * config.head_dim;
        let tensor = |name: &str, width: usize| Tensor::empty(ctx, name, &[n_tokens, width]);
        Ok(Activations {
            normed: tensor("normed", config.hidden)?,
            q: tensor("q", q_width)?,
            k: tensor("k", kv_width)?,
            v: tensor("v", kv_width)?,
            attention: tensor("attention", q_width)?,
            projected: tensor("projected", config.hidden)?,
            gate: tensor("ffn gate", config.ffn)?,
            up: tensor("ffn up", config.ffn)?,
        })
    }
}
