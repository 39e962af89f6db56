//! The engine: many requests served at once from one step loop, with continuous batching,
//! chunked prefill, a paged KV cache with prefix caching, per-request sampling, streaming and
//! abort.
//!
//! [`Engine::new`] returns a cheap-to-clone [`Engine`] handle and the [`StepLoop`], a future
//! that owns the model, the KV cache and the scheduler. The host decides where the loop runs (a
//! background thread natively, `wasm_bindgen_futures::spawn_local` in the browser); the core
//! has no threads and no runtime of its own. Requests reach the loop through a channel and
//! their outputs come back the same way: [`Engine::generate`] returns a [`GenerationStream`].
//! Dropping the stream aborts its request at the next step and frees its KV blocks.
//!
//! Each step is one forward pass over the running batch: the next token of every decoding
//! sequence and chunks of prompts, within a token budget (see `scheduler.rs`), then one
//! readback of the rows of logits it produced, sampling, and the new text for every stream.
//!
//! Faults stay with the requests they touch. A step whose forward pass fails or panics (a
//! kernel launcher's bug) fails the requests of that step; a sampler that panics fails its own
//! sequence; the other requests go on. A GPU error (the device lost, out of memory) leaves
//! the device's state untrustworthy: every request then fails, new ones are refused, and
//! [`Engine::health`] reports why until the model is loaded again on a new device.
//!
//! ```no_run
//! # async fn example() -> flint_core::Result<()> {
//! use futures::StreamExt;
//! use flint_core::engine::{Engine, EngineOptions, GenerateRequest, Prompts};
//! use flint_core::gguf::GgufFile;
//! use flint_core::gpu::{GpuContext, GpuOptions};
//!
//! let ctx = GpuContext::new(&GpuOptions::default()).await?;
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let (engine, step_loop) = Engine::load(ctx, &file, EngineOptions::default())?;
//! // The host drives the step loop; here, next to the request on the same executor.
//! let request = GenerateRequest {
//!     text: Some(Prompts::One("The capital of France is".into())),
//!     ..Default::default()
//! };
//! let mut stream = engine.generate(request);
//! drop(engine); // the loop ends when every handle and stream is gone
//! let client = async move {
//!     while let Some(item) = stream.next().await {
//!         print!("{}", item?.text);
//!     }
//!     flint_core::Result::Ok(())
//! };
//! let ((), result) = futures::future::join(step_loop.run(), client).await;
//! result
//! # }
//! ```

mod admission;
mod loaded;
mod request;
mod scheduler;
mod sequence;
mod step_loop;
mod stop;

use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use async_channel::{Receiver, Sender};
use futures::Stream;
use serde::Serialize;

pub use loaded::{LoadedModel, LoadedModelUpload};
pub use request::{
    FinishReason, GenerateOutput, GenerateRequest, Logprobs, MetaInfo, Prompts, StopMatch, TokenLogprob,
};
pub use step_loop::StepLoop;

use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::grammar::GrammarCompiler;
use crate::model::{MemoryPlan, Model, PlanRequest, WeightUpload};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use scheduler::{Limits, Scheduler};
use sequence::Sequence;

/// How the engine batches and caches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Sequences in the running batch at most; more wait their turn.
    pub max_running: usize,
    /// Tokens per forward pass at most: the decode tokens of the running batch plus chunks of
    /// prompts. Bounds a step's latency, so a long prompt does not stall running streams.
    pub step_token_budget: usize,
    /// Tokens the KV cache holds over all sequences. By default, with [`Engine::load`], as many
    /// as the model's [`MemoryPlan`] finds room for, up to the model's context (at most
    /// [`UNKNOWN_MEMORY_KV_BYTES`](crate::model::UNKNOWN_MEMORY_KV_BYTES) of it where the device's memory is not known); with
    /// [`Engine::new`], the model's context capped at what one storage binding holds per layer.
    pub kv_cache_tokens: Option<usize>,
    /// Keep finished prompts' full KV blocks and reuse them for requests with the same prefix.
    pub prefix_cache: bool,
    /// Seeds the samplers of requests without a seed of their own (the core has no entropy of
    /// its own on the web: the host passes some).
    pub seed: u64,
    /// While every running sequence decodes greedily, submit each step before reading back the
    /// one before it, so that the GPU does not wait for the host between them. Outputs are the
    /// same either way. By default (`None`) on GPUs, off on CPU devices, where the device's work
    /// runs on the host's own cores.
    pub overlap_steps: Option<bool>,
}

impl EngineOptions {
    /// What a [`MemoryPlan`] for an engine of these options makes room for.
    pub fn plan_request(&self) -> PlanRequest {
        PlanRequest {
            kv_tokens: self.kv_cache_tokens,
            step_tokens: self.step_token_budget,
            max_rows: self.max_running,
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_running: 32,
            step_token_budget: 256,
            kv_cache_tokens: None,
            prefix_cache: true,
            seed: 0,
            overlap_steps: None,
        }
    }
}

/// What the engine is doing, as of its last step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineMetrics {
    /// Sequences in the running batch.
    pub running_sequences: usize,
    /// Sequences waiting for admission.
    pub waiting_sequences: usize,
    /// Blocks of the KV cache, all together.
    pub kv_blocks_total: usize,
    /// Blocks used by running sequences.
    pub kv_blocks_used: usize,
    /// Blocks no sequence uses that hold a cached prefix (reusable, or evicted when needed).
    pub kv_blocks_cached: usize,
    /// Blocks a new sequence can take: free and cached ones.
    pub kv_blocks_free: usize,
    /// Tokens per KV block.
    pub kv_block_tokens: usize,
    /// Prompt tokens of every admitted sequence.
    pub prompt_tokens: u64,
    /// Of those, tokens whose keys and values came from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// `cached_prompt_tokens / prompt_tokens` (0 before any prompt).
    pub prefix_cache_hit_rate: f64,
    /// Tokens generated since the engine started.
    pub generated_tokens: u64,
    /// Tokens generated per second over the last steps.
    pub generation_tokens_per_second: f64,
    /// Forward passes run.
    pub steps: u64,
    /// Of those, passes submitted before the draws of the one before them were read back
    /// ([`EngineOptions::overlap_steps`]).
    pub overlapped_steps: u64,
    /// Sequences preempted (and later recomputed) because the KV cache was full.
    pub preemptions: u64,
    /// False once the GPU failed (see [`Engine::health`]).
    pub healthy: bool,
}

/// A message to the step loop.
enum Command {
    Submit(Vec<Sequence>),
    Embed(EmbedJob),
    Abort(String),
    FlushCache(futures::channel::oneshot::Sender<()>),
    #[cfg(feature = "fault-injection")]
    Inject(Fault),
}

/// Inputs to embed ([`Engine::embed`]), and where their embeddings go.
struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    reply: futures::channel::oneshot::Sender<Result<Embeddings>>,
}

/// The embeddings of a request's inputs ([`Engine::embed`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    /// One unit-length vector of the model's width per input, in the inputs' order.
    pub vectors: Vec<Vec<f32>>,
    /// The tokens of all the inputs.
    pub prompt_tokens: usize,
}

/// A fault for tests to inject into the step loop ([`Engine::inject_fault`]), to check that
/// it fails only what it should.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next forward pass panics, as a bug in a kernel launcher would.
    PanicInForwardPass,
    /// The next draw of a sequence of request `rid` panics, as a bug in the sampler would.
    PanicWhileSampling(String),
    /// The GPU device is destroyed (`wgpu::Device::destroy`), as a driver reset or an unplugged
    /// GPU loses it.
    DestroyDevice,
}

/// Why the engine is unhealthy, once it is: shared by the handles, the step loop and the
/// device's lost callback.
#[derive(Clone, Default)]
struct Health(Arc<Mutex<Option<String>>>);

impl Health {
    /// The reason, when the engine is unhealthy.
    fn failure(&self) -> Option<String> {
        self.0.lock().map_or_else(|poisoned| poisoned.into_inner().clone(), |reason| reason.clone())
    }

    /// Records `reason`; the first one stays.
    fn fail(&self, reason: String) {
        let mut slot = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.get_or_insert(reason);
    }

    fn check(&self) -> Result<()> {
        self.failure().map_or(Ok(()), |reason| Err(Error::Unhealthy(reason)))
    }
}

/// What the handles share.
struct Shared {
    commands: Sender<Command>,
    tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
    context_length: usize,
    kv_capacity_tokens: usize,
    metrics: Arc<Mutex<EngineMetrics>>,
    health: Health,
    next_id: AtomicU64,
    seed: u64,
    /// Made at the first request with a structured-output constraint (or why it cannot be).
    grammar: OnceLock<std::result::Result<GrammarCompiler, String>>,
}

/// A handle on the engine: cheap to clone, shared by all callers.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
}

/// An engine whose model's weights are still coming ([`Engine::begin_load`]).
pub struct EngineUpload {
    weights: WeightUpload,
    tokenizer: Tokenizer,
    options: EngineOptions,
}

impl EngineUpload {
    /// The model's weights, to write as their bytes come.
    pub fn weights(&mut self) -> &mut WeightUpload {
        &mut self.weights
    }

    /// The engine and its step loop, once every weight is written.
    pub fn finish(self) -> Result<(Engine, StepLoop)> {
        Engine::new(self.weights.finish()?, self.tokenizer, self.options)
    }
}

impl Engine {
    /// An engine serving `model`, with `tokenizer` (the model's), and the step loop that runs
    /// it. Nothing runs until the host polls the loop.
    pub fn new(model: Model, tokenizer: Tokenizer, options: EngineOptions) -> Result<(Engine, StepLoop)> {
        if options.max_running == 0 || options.step_token_budget < options.max_running {
            return Err(Error::InvalidParameter {
                field: "step_token_budget",
                reason: format!(
                    "{} tokens per step with up to {} running sequences: the budget must hold at least one \
                     token of every running sequence, and at least one sequence must run",
                    options.step_token_budget, options.max_running
                ),
            });
        }
        let config = model.config();
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(Error::InvalidParameter {
                field: "tokenizer",
                reason: format!(
                    "the tokenizer has {} tokens but the model's output has {}: they are not the same model's",
                    tokenizer.vocab_size(),
                    config.vocab_size
                ),
            });
        }
        let cache = model.new_kv_cache(options.kv_cache_tokens)?;
        let limits = Limits {
            max_running: options.max_running,
            token_budget: options.step_token_budget,
            max_logit_rows: model.max_logit_rows().max(1),
            prefix_cache: options.prefix_cache,
            overlap_steps: options
                .overlap_steps
                .unwrap_or_else(|| crate::tuning::overlaps_steps(model.gpu().device_class())),
        };
        let (commands, receiver) = async_channel::unbounded();
        let tokenizer = Arc::new(tokenizer);
        let metrics = Arc::new(Mutex::new(EngineMetrics::default()));
        let health = Health::default();
        let lost = health.clone();
        model.gpu().device().set_device_lost_callback(move |reason, message| {
            lost.fail(format!("the GPU device was lost ({reason:?}: {message})"));
        });
        let shared = Shared {
            commands,
            tokenizer: tokenizer.clone(),
            vocab_size: config.vocab_size,
            context_length: config.context_length,
            kv_capacity_tokens: cache.capacity_tokens(),
            metrics: metrics.clone(),
            health: health.clone(),
            next_id: AtomicU64::new(0),
            seed: options.seed,
            grammar: OnceLock::new(),
        };
        let step_loop =
            StepLoop::new(model, tokenizer, cache, Scheduler::new(limits), receiver, metrics, health);
        Ok((Engine { shared: Arc::new(shared) }, step_loop))
    }

    /// Loads the model and tokenizer of a GGUF file onto `ctx`'s GPU and makes an engine of them.
    ///
    /// The model's [`MemoryPlan`] comes first: a model that cannot fit the device fails here,
    /// before any upload, and without [`EngineOptions::kv_cache_tokens`] the KV cache gets the
    /// room the plan finds (up to the model's context).
    pub fn load(ctx: Arc<GpuContext>, file: &GgufFile, options: EngineOptions) -> Result<(Engine, StepLoop)> {
        let mut upload = Engine::begin_load(ctx, file, options)?;
        upload.weights().write_from(file)?;
        upload.finish()
    }

    /// [`Engine::load`] for weights that come later: plans, reads the tokenizer and builds the
    /// model ([`Model::begin_load`]); the [`EngineUpload`] takes the weights as they come and
    /// then makes the engine. `file` may be opened from its header
    /// ([`GgufFile::from_header`]).
    pub fn begin_load(ctx: Arc<GpuContext>, file: &GgufFile, options: EngineOptions) -> Result<EngineUpload> {
        let tokenizer = Tokenizer::from_gguf(file)?;
        let plan = MemoryPlan::new(&ctx, file, &options.plan_request())?;
        let weights = Model::begin_load(ctx, file)?;
        Ok(EngineUpload {
            weights,
            tokenizer,
            options: EngineOptions { kv_cache_tokens: Some(plan.kv_tokens), ..options },
        })
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    /// The most tokens one sequence may hold, prompt and generated tokens together: the model's
    /// context, or the KV cache's capacity when that is smaller.
    pub fn max_sequence_tokens(&self) -> usize {
        self.shared.context_length.min(self.shared.kv_capacity_tokens)
    }

    /// Submits a request. The stream yields its outputs (see [`GenerateOutput`]) and ends after
    /// the last one. A request that is invalid (no prompt, a token outside the vocabulary, a
    /// sampling parameter out of range, a JSON Schema, regex or grammar that does not compile,
    /// more tokens than the context holds) yields one error, naming what is wrong, and nothing
    /// is queued.
    pub fn generate(&self, request: GenerateRequest) -> GenerationStream {
        let (output, items) = async_channel::unbounded();
        let submitted =
            self.health().and_then(|()| self.prepare(request, output.clone())).and_then(|sequences| {
                self.shared
                    .commands
                    .try_send(Command::Submit(sequences))
                    .map_err(|_| Error::EngineStopped("its step loop has ended".into()))
            });
        if let Err(error) = submitted {
            // Unbounded and open: cannot fail.
            let _ = output.try_send(Err(error));
        }
        GenerationStream { items: Box::pin(items) }
    }

    /// The embeddings of `inputs` (token ids; tokenize texts with [`Engine::tokenizer`], special
    /// tokens added): each input's final hidden states, after the output norm, pooled as the
    /// model's `pooling_type` says ([`crate::model::Pooling`]: the mean unless the file says
    /// otherwise) and scaled to unit length. Inputs run between steps, each in KV blocks of its
    /// own that are given back at once. An empty input, or one longer than
    /// [`Engine::max_sequence_tokens`], is an error naming it.
    pub async fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Embeddings> {
        self.health()?;
        if inputs.is_empty() {
            return Err(Error::InvalidParameter {
                field: "input",
                reason: "there is nothing to embed".into(),
            });
        }
        let most = self.max_sequence_tokens();
        for (index, input) in inputs.iter().enumerate() {
            let reason = match input.len() {
                0 => format!("input {index} is empty"),
                length if length > most => {
                    format!("input {index} has {length} tokens, more than the {most} one sequence may hold")
                }
                _ => continue,
            };
            return Err(Error::InvalidParameter { field: "input", reason });
        }
        let vocab = self.shared.vocab_size;
        if let Some((index, &token)) = inputs.iter().enumerate().find_map(|(index, input)| {
            input.iter().find(|&&token| token as usize >= vocab).map(|token| (index, token))
        }) {
            let reason =
                format!("input {index} has token id {token}, outside the vocabulary of {vocab} tokens");
            return Err(Error::InvalidParameter { field: "input", reason });
        }
        let (reply, done) = futures::channel::oneshot::channel();
        self.shared
            .commands
            .try_send(Command::Embed(EmbedJob { inputs, reply }))
            .map_err(|_| Error::EngineStopped("its step loop has ended".into()))?;
        done.await.map_err(|_| Error::EngineStopped("its step loop ended before the embeddings".into()))?
    }

    /// Aborts every request whose `rid` is `rid`: each of its sequences ends with
    /// [`FinishReason::Abort`] at the next step, and its KV blocks are freed.
    pub fn abort(&self, rid: &str) {
        let _ = self.shared.commands.try_send(Command::Abort(rid.to_string()));
    }

    /// Empties the prefix cache: blocks no sequence uses become free.
    pub async fn flush_cache(&self) -> Result<()> {
        let (reply, done) = futures::channel::oneshot::channel();
        self.shared
            .commands
            .try_send(Command::FlushCache(reply))
            .map_err(|_| Error::EngineStopped("its step loop has ended".into()))?;
        done.await.map_err(|_| Error::EngineStopped("its step loop ended before flushing".into()))
    }

    /// What the engine is doing, as of its last step.
    pub fn metrics(&self) -> EngineMetrics {
        self.shared.metrics.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Ok while the engine can serve; [`Error::Unhealthy`] once its GPU failed (the device was
    /// lost, ran out of memory, or reported an error in a step). An unhealthy engine fails
    /// every request: load the model again, on a new device.
    pub fn health(&self) -> Result<()> {
        self.shared.health.check()
    }

    /// Makes the step loop meet `fault` (tests only: the `fault-injection` feature).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn inject_fault(&self, fault: Fault) {
        let _ = self.shared.commands.try_send(Command::Inject(fault));
    }
}

/// The outputs of one request. Ends after its last item; dropping it aborts the request at the
/// engine's next step.
pub struct GenerationStream {
    items: Pin<Box<Receiver<Result<GenerateOutput>>>>,
}

impl Stream for GenerationStream {
    type Item = Result<GenerateOutput>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.items.as_mut().poll_next(cx)
    }
}
