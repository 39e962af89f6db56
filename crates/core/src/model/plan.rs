//! [`MemoryPlan`]: what a model will hold on a device (weights, KV cache, a step's activations),
//! worked out from the GGUF file and the device's limits before anything is uploaded, so that a
//! model that cannot fit fails at once with the numbers, and a KV cache without a requested size
//! gets the room that is left.

use std::fmt;

use serde::Serialize;

use crate::gguf::GgufFile;
use crate::gpu::{DeviceClass, GpuContext, Tensor, weight};
use crate::kv::KvCacheShape;
use crate::model::{KV_BLOCK_TOKENS, ModelConfig};
use crate::{Error, Result};

/// The most bytes a KV cache without a requested size takes where the device's memory is not
/// known (a GPU without a budget: WebGPU does not report its memory, natively or in a browser),
/// so that a long-context model does not claim more than a common GPU has: 16k tokens of a
/// Llama-3.1-8B, 64k of a Llama-3.2-1B.
pub const UNKNOWN_MEMORY_KV_BYTES: u64 = 2 << 30;

/// Tokens of a KV cache without a requested size: at most `most`, in whole blocks, and as many
/// as fit `room` bytes (`kv_bytes` of a number of tokens, with the pool's rounding and the
/// tensors' padding), or [`UNKNOWN_MEMORY_KV_BYTES`] where the room is not known; one block at
/// least (a plan that cannot hold it fails its check).
fn default_kv_tokens(
    most: usize,
    room: Option<u64>,
    kv_bytes_per_token: u64,
    kv_bytes: impl Fn(usize) -> u64,
) -> usize {
    let whole_blocks = |tokens: usize| tokens / KV_BLOCK_TOKENS * KV_BLOCK_TOKENS;
    let room = room.unwrap_or(UNKNOWN_MEMORY_KV_BYTES);
    // None past room / bytes per token, then fewer by the rounding (a few hundred blocks at most).
    let mut tokens = most.min(whole_blocks((room / kv_bytes_per_token) as usize)).max(KV_BLOCK_TOKENS);
    while tokens > KV_BLOCK_TOKENS && kv_bytes(tokens) > room {
        tokens -= KV_BLOCK_TOKENS;
    }
    tokens
}

/// What the plan is asked to make room for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanRequest {
    /// Tokens the KV cache must hold over all sequences; `None`: as many as fit, up to the
    /// model's context (and to [`UNKNOWN_MEMORY_KV_BYTES`] where the memory is not known).
    pub kv_tokens: Option<usize>,
    /// Tokens of one forward pass at most (`EngineOptions::step_token_budget`).
    pub step_tokens: usize,
    /// Sequences of one step at most, each with a row of logits (`EngineOptions::max_running`).
    pub max_rows: usize,
}

/// Where the memory a plan must fit comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// The budget the GPU context was opened with (`GpuOptions::memory_budget`).
    Budget,
    /// The host's available memory: a CPU device (such as lavapipe) allocates from it.
    HostMemory,
}

impl fmt::Display for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemorySource::Budget => "the GPU memory budget",
            MemorySource::HostMemory => "the host's available memory (a CPU device)",
        })
    }
}

/// The memory a model needs on one device, in bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// Weights as the GPU holds them (rows in the GPU layout, vectors in f32).
    pub weight_bytes: u64,
    /// One token's keys and values over every layer (f16).
    pub kv_bytes_per_token: u64,
    /// Tokens the KV cache holds: the requested number, or as many as fit (whole blocks, at
    /// most the model's context).
    pub kv_tokens: usize,
    /// The KV cache.
    pub kv_bytes: u64,
    /// A step's activations at most: hidden states, projections, the feed-forward's
    /// intermediates and the logits, for the request's tokens and rows.
    pub activation_bytes: u64,
    /// The activations of the smallest step (one token), which must fit beside the weights and
    /// the KV cache for the model to run at all; a larger step that does not fit fails alone.
    pub min_activation_bytes: u64,
    /// The model's context length.
    pub context_tokens: usize,
    /// The most tokens the KV cache can hold on this device: a layer's keys must fit one
    /// storage binding.
    pub max_kv_tokens: usize,
    /// The memory the plan must fit, when known (a budget, or the host's memory for a CPU
    /// device); a GPU's own memory is not reported by WebGPU.
    pub available_bytes: Option<u64>,
    /// Where `available_bytes` comes from.
    pub available_from: Option<MemorySource>,
}

impl MemoryPlan {
    /// The plan for `file`'s model on `ctx`'s device. An error when the model cannot fit: the
    /// requested KV cache past the device's binding limit, or the weights, the KV cache and a
    /// one-token step past the available memory; the message holds the plan's figures and says
    /// what to change.
    pub fn new(ctx: &GpuContext, file: &GgufFile, request: &PlanRequest) -> Result<MemoryPlan> {
        let config = ModelConfig::from_gguf(file)?;
        let available = match ctx.memory_budget() {
            // What is not held already (another model on the same context).
            Some(budget) => Some((budget.saturating_sub(ctx.memory_in_use()), MemorySource::Budget)),
            None if ctx.device_class() == DeviceClass::Cpu => {
                crate::gpu::host_available_memory().map(|bytes| (bytes, MemorySource::HostMemory))
            }
            None => None,
        };
        let shape =
            KvCacheShape { layers: config.n_layers, kv_heads: config.n_kv_heads, head_dim: config.head_dim };
        let kv_bytes = |tokens: usize| shape.cache_bytes(ctx, KV_BLOCK_TOKENS, tokens);
        let max_kv_tokens = shape.max_tokens(ctx.max_binding_bytes(), KV_BLOCK_TOKENS);
        let weight_bytes = weight_bytes(ctx, file)?;
        let min_activation_bytes = step_activation_bytes(&config, 1, 1);
        let activation_bytes = step_activation_bytes(&config, request.step_tokens, request.max_rows);
        let kv_bytes_per_token = shape.token_bytes_per_layer() * 2 * shape.layers as u64;
        let kv_tokens = request.kv_tokens.unwrap_or_else(|| {
            let most = config.context_length.min(max_kv_tokens);
            let room = available.map(|(bytes, _)| bytes.saturating_sub(weight_bytes + activation_bytes));
            default_kv_tokens(most, room, kv_bytes_per_token, kv_bytes)
        });
        let plan = MemoryPlan {
            weight_bytes,
            kv_bytes_per_token,
            kv_tokens,
            kv_bytes: kv_bytes(kv_tokens),
            activation_bytes,
            min_activation_bytes,
            context_tokens: config.context_length,
            max_kv_tokens,
            available_bytes: available.map(|(bytes, _)| bytes),
            available_from: available.map(|(_, from)| from),
        };
        plan.checked(request)
    }

    /// Everything the plan holds at once, with a step of the requested size.
    pub fn total_bytes(&self) -> u64 {
        self.weight_bytes + self.kv_bytes + self.activation_bytes
    }

    /// What the model needs to run at all: the weights, the KV cache and a one-token step.
    pub fn required_bytes(&self) -> u64 {
        self.weight_bytes + self.kv_bytes + self.min_activation_bytes
    }

    /// The plan in one line, for an error message.
    fn one_line(&self) -> String {
        let available = match (self.available_bytes, self.available_from) {
            (Some(bytes), Some(from)) => format!(" of {} ({from})", mib(bytes)),
            _ => String::new(),
        };
        format!(
            "plan: weights {} + KV cache {} ({} tokens) + activations {} = {}{available}",
            mib(self.weight_bytes),
            mib(self.kv_bytes),
            self.kv_tokens,
            mib(self.activation_bytes),
            mib(self.total_bytes())
        )
    }

    fn checked(self, request: &PlanRequest) -> Result<MemoryPlan> {
        let too_large = |reason: String| Error::DoesNotFit { reason, plan: self.one_line() };
        if self.kv_tokens > self.max_kv_tokens {
            return Err(too_large(format!(
                "a KV cache of {} tokens does not fit this device: one layer's keys must fit one storage binding, \
                 which holds {} tokens; ask for fewer (--ctx-size, kvCacheTokens in JS)",
                self.kv_tokens, self.max_kv_tokens
            )));
        }
        if let (Some(available), Some(from)) = (self.available_bytes, self.available_from)
            && self.required_bytes() > available
        {
            let advice = if request.kv_tokens.is_some() {
                "ask for a smaller KV cache (--ctx-size, kvCacheTokens in JS)"
            } else {
                "the weights leave no room for a KV cache of one block and a step: use a smaller model or a smaller \
                 quantization"
            };
            let budget_advice =
                if from == MemorySource::Budget { "; or raise the budget (--gpu-memory-budget)" } else { "" };
            return Err(too_large(format!(
                "the model needs {} but {from} is {}: {advice}{budget_advice}",
                mib(self.required_bytes()),
                mib(available)
            )));
        }
        Ok(self)
    }
}

/// The weights as the upload will hold them on `ctx`'s device: matrices in chunks of the GPU
/// layout (buffers, or textures of whole rows), vectors (norms, biases) as pooled f32 tensors.
fn weight_bytes(ctx: &GpuContext, file: &GgufFile) -> Result<u64> {
    file.tensors()
        .iter()
        .map(|info| match info.rows() {
            0 | 1 => Ok(Tensor::allocated_bytes(ctx, info.elements())),
            rows => weight::uploaded_bytes(ctx, info.name(), info.quant(), rows, info.row_elements()),
        })
        .sum()
}

/// The largest set of a step's activation tensors alive at once: the residual stream and its
/// normed copy, q, k and v, the attention output, the feed-forward's gate, up and activated rows,
/// and the logits with their candidates.
fn step_activation_bytes(config: &ModelConfig, step_tokens: usize, max_rows: usize) -> u64 {
    let q = config.n_heads * config.head_dim;
    let kv = config.n_kv_heads * config.head_dim;
    let per_token = 3 * config.hidden + 2 * q + 2 * kv + 3 * config.ffn;
    let logits = max_rows.min(step_tokens) * config.vocab_size;
    // A quarter more for the pool's size classes and the small tensors (positions, tables).
    (step_tokens * per_token + logits) as u64 * 4 * 5 / 4
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "memory plan:")?;
        writeln!(f, "  weights      {:>12}", mib(self.weight_bytes))?;
        writeln!(
            f,
            "  KV cache     {:>12}  ({} tokens of {} KiB; f16; context {}, device limit {})",
            mib(self.kv_bytes),
            self.kv_tokens,
            self.kv_bytes_per_token as f64 / 1024.0,
            self.context_tokens,
            self.max_kv_tokens
        )?;
        writeln!(
            f,
            "  activations  {:>12}  (a full step; {} for one token)",
            mib(self.activation_bytes),
            mib(self.min_activation_bytes)
        )?;
        write!(f, "  total        {:>12}", mib(self.total_bytes()))?;
        match (self.available_bytes, self.available_from) {
            (Some(available), Some(from)) => write!(f, "  of {} ({from})", mib(available)),
            _ => write!(f, "  (the device's free memory is not known)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_kv_cache_fits_its_room_or_a_bound_where_the_memory_is_unknown() {
        let exact = |per_token: u64| move |tokens: usize| tokens as u64 * per_token;
        // Llama-3.1-8B: 128 KiB a token, 131072 tokens of context; a GPU of unknown memory
        // gets 2 GiB of cache.
        let per_token = 128 << 10;
        assert_eq!(default_kv_tokens(131_072, None, per_token, exact(per_token)), 16_384);
        // Known room: what fits, in whole blocks, after the padding's rounding too.
        let room = (1 << 30) + 100 * per_token;
        assert_eq!(default_kv_tokens(131_072, Some(room), per_token, exact(per_token)), 8_288);
        let padded = |tokens: usize| exact(per_token)(tokens) + (64 << 20);
        assert_eq!(default_kv_tokens(131_072, Some(room), per_token, padded), 7_776);
        // A short context is not stretched; no room leaves one block, which the check refuses.
        assert_eq!(default_kv_tokens(8_192, None, 23 << 10, exact(23 << 10)), 8_192);
        assert_eq!(default_kv_tokens(8_192, Some(0), per_token, exact(per_token)), KV_BLOCK_TOKENS);
    }
}
