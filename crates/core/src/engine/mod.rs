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

mod request;
mod scheduler;
mod sequence;
mod stop;

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use async_channel::{Receiver, Sender};
use futures::{FutureExt, Stream};
use serde::Serialize;
use web_time::Instant;

pub use request::{
    FinishReason, GenerateOutput, GenerateRequest, Logprobs, MetaInfo, Prompts, StopMatch, TokenLogprob,
};

use crate::error::panic_message;
use crate::gguf::GgufFile;
use crate::gpu::{GpuContext, Tensor};
use crate::grammar::{GrammarCompiler, TokenConstraint};
use crate::kernels::sample::{CandidateDepth, RowCandidates, top_candidates};
use crate::kv::KvCache;
use crate::model::{LogitRows, Model, SequenceChunk};
use crate::sample::{Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use scheduler::{Limits, Planned, Scheduler};
use sequence::{RequestHandle, Sequence};

/// How the engine batches and caches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Sequences in the running batch at most; more wait their turn.
    pub max_running: usize,
    /// Tokens per forward pass at most: the decode tokens of the running batch plus chunks of
    /// prompts. Bounds a step's latency, so a long prompt does not stall running streams.
    pub step_token_budget: usize,
    /// Tokens the KV cache holds over all sequences; by default the model's context, capped at
    /// what one storage binding holds per layer.
    pub kv_cache_tokens: Option<usize>,
    /// Keep finished prompts' full KV blocks and reuse them for requests with the same prefix.
    pub prefix_cache: bool,
    /// Seeds the samplers of requests without a seed of their own (the core has no entropy of
    /// its own on the web: the host passes some).
    pub seed: u64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_running: 32,
            step_token_budget: 256,
            kv_cache_tokens: None,
            prefix_cache: true,
            seed: 0,
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
    /// Sequences preempted (and later recomputed) because the KV cache was full.
    pub preemptions: u64,
    /// False once the GPU failed (see [`Engine::health`]).
    pub healthy: bool,
}

/// A message to the step loop.
enum Command {
    Submit(Vec<Sequence>),
    Abort(String),
    FlushCache(futures::channel::oneshot::Sender<()>),
    #[cfg(feature = "fault-injection")]
    Inject(Fault),
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
        let step_loop = StepLoop {
            model,
            tokenizer,
            cache,
            scheduler: Scheduler::new(limits),
            commands: receiver,
            metrics,
            health,
            counters: Counters::default(),
            prefix_cache: options.prefix_cache,
            #[cfg(feature = "fault-injection")]
            faults: Vec::new(),
        };
        step_loop.publish_metrics();
        Ok((Engine { shared: Arc::new(shared) }, step_loop))
    }

    /// Loads the model and tokenizer of a GGUF file onto `ctx`'s GPU and makes an engine of them.
    pub fn load(ctx: Arc<GpuContext>, file: &GgufFile, options: EngineOptions) -> Result<(Engine, StepLoop)> {
        let tokenizer = Tokenizer::from_gguf(file)?;
        let model = Model::load(ctx, file)?;
        Engine::new(model, tokenizer, options)
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
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

    /// Checks a request and turns it into sequences (one per prompt and sample).
    fn prepare(
        &self,
        request: GenerateRequest,
        output: Sender<Result<GenerateOutput>>,
    ) -> Result<Vec<Sequence>> {
        let shared = &*self.shared;
        let prompts: Vec<Vec<u32>> = match (&request.text, &request.input_ids) {
            (Some(text), None) => {
                text.as_slice().iter().map(|t| shared.tokenizer.encode(t, true, true)).collect()
            }
            (None, Some(ids)) => ids.as_slice().to_vec(),
            _ => {
                return Err(Error::InvalidParameter {
                    field: "text",
                    reason: "give exactly one of `text` and `input_ids`".into(),
                });
            }
        };
        if prompts.is_empty() {
            return Err(Error::InvalidParameter { field: "text", reason: "the batch has no prompts".into() });
        }
        let params = &request.sampling;
        params.validate(shared.vocab_size)?;
        for prompt in &prompts {
            self.check_prompt(prompt, &request)?;
        }
        if request.top_logprobs_num > shared.vocab_size {
            return Err(Error::InvalidParameter {
                field: "top_logprobs_num",
                reason: format!(
                    "{} is more than the vocabulary's {} tokens",
                    request.top_logprobs_num, shared.vocab_size
                ),
            });
        }
        let constraint = self.compile_constraint(params)?;
        let request_number = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(RequestHandle {
            rid: request.rid.clone().unwrap_or_else(|| format!("flint-{request_number}")),
            stream: request.stream,
            return_logprob: request.return_logprob,
            top_logprobs_num: request.top_logprobs_num,
            logprob_start_len: request.logprob_start_len,
            submitted: Instant::now(),
            output,
        });
        let samples = params.n;
        let mut sequences = Vec::with_capacity(prompts.len() * samples);
        for (prompt_index, prompt) in prompts.into_iter().enumerate() {
            let mut leader = None;
            for sample in 0..samples {
                let index = prompt_index * samples + sample;
                let mut sample_params = params.clone();
                // Samples of one prompt differ by seed; each is reproducible on its own.
                sample_params.seed = params.seed.map(|s| s.wrapping_add(sample as u64));
                let fallback = mix_seed(shared.seed, request_number, index as u64);
                let sampler = Sampler::new(
                    sample_params,
                    fallback,
                    shared.vocab_size,
                    &prompt,
                    shared.tokenizer.end_of_generation(),
                )?;
                let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                let constraint = constraint.as_ref().map(TokenConstraint::fork);
                let mut sequence =
                    Sequence::new(id, index, handle.clone(), prompt.clone(), sampler, constraint);
                sequence.prompt_leader = leader;
                leader.get_or_insert(id);
                sequences.push(sequence);
            }
        }
        Ok(sequences)
    }

    /// Compiles the request's structured-output constraint, if it has one (on the caller's
    /// side: the step loop never waits for a compilation).
    fn compile_constraint(&self, params: &SamplingParams) -> Result<Option<TokenConstraint>> {
        let Some(constraint) = params.output_constraint()? else { return Ok(None) };
        let shared = &*self.shared;
        let compiler = shared.grammar.get_or_init(|| {
            GrammarCompiler::new(&shared.tokenizer, shared.vocab_size).map_err(|error| error.to_string())
        });
        match compiler {
            Ok(compiler) => compiler.compile(params),
            Err(reason) => Err(Error::InvalidParameter {
                field: constraint.field(),
                reason: format!("structured output is not available with this model: {reason}"),
            }),
        }
    }

    fn check_prompt(&self, prompt: &[u32], request: &GenerateRequest) -> Result<()> {
        let shared = &*self.shared;
        if prompt.is_empty() {
            return Err(Error::InvalidParameter { field: "text", reason: "a prompt has no tokens".into() });
        }
        if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= shared.vocab_size) {
            return Err(Error::TokenOutOfVocabulary { id: bad, vocab_size: shared.vocab_size });
        }
        let max_new = request.sampling.max_new_tokens;
        // Saturating: `max_new_tokens` comes from the caller, up to usize::MAX.
        let needed = prompt.len().saturating_add(max_new);
        for (limit, what) in [
            (shared.context_length, "the model's context"),
            (shared.kv_capacity_tokens, "the engine's KV cache"),
        ] {
            if needed > limit {
                return Err(Error::InvalidParameter {
                    field: "max_new_tokens",
                    reason: format!(
                        "the prompt has {} tokens and {max_new} new tokens were asked for, more than {what} of \
                         {limit} tokens; ask for at most {} new tokens or shorten the prompt",
                        prompt.len(),
                        limit.saturating_sub(prompt.len())
                    ),
                });
            }
        }
        if let Some(start) = request.logprob_start_len
            && start > prompt.len()
        {
            return Err(Error::InvalidParameter {
                field: "logprob_start_len",
                reason: format!("{start} is past the end of a prompt of {} tokens", prompt.len()),
            });
        }
        Ok(())
    }
}

/// A seed for a request without one: distinct per engine seed, request and sequence.
fn mix_seed(engine: u64, request: u64, index: u64) -> u64 {
    // splitmix64's finaliser over the three.
    let mut z =
        engine ^ request.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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

/// Running totals behind [`EngineMetrics`].
#[derive(Default)]
struct Counters {
    generated_tokens: u64,
    steps: u64,
    /// (end of step, tokens generated by it) of the last steps.
    recent: VecDeque<(Instant, usize)>,
    /// When the oldest step of `recent` started.
    window_start: Option<Instant>,
}

/// Steps that the tokens-per-second figure averages over.
const RATE_WINDOW_STEPS: usize = 32;

impl Counters {
    fn record_step(&mut self, started: Instant, generated: usize) {
        self.steps += 1;
        self.generated_tokens += generated as u64;
        if self.recent.is_empty() {
            self.window_start = Some(started);
        }
        self.recent.push_back((Instant::now(), generated));
        if self.recent.len() > RATE_WINDOW_STEPS
            && let Some((end, _)) = self.recent.pop_front()
        {
            self.window_start = Some(end);
        }
    }

    fn rate(&self) -> f64 {
        let (Some(start), Some((end, _))) = (self.window_start, self.recent.back()) else { return 0.0 };
        let seconds = end.duration_since(start).as_secs_f64();
        let tokens: usize = self.recent.iter().map(|(_, n)| n).sum();
        if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 }
    }
}

/// The engine's step loop: owns the model, the KV cache and the scheduler. Run it with
/// [`StepLoop::run`] on the host's executor; it returns when every [`Engine`] handle and every
/// stream is gone and no work is left.
pub struct StepLoop {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    cache: KvCache,
    scheduler: Scheduler,
    commands: Receiver<Command>,
    metrics: Arc<Mutex<EngineMetrics>>,
    health: Health,
    counters: Counters,
    prefix_cache: bool,
    /// Faults injected and not met yet.
    #[cfg(feature = "fault-injection")]
    faults: Vec<Fault>,
}

impl StepLoop {
    /// Runs steps while there is work, and waits for requests while there is none.
    pub async fn run(mut self) {
        loop {
            if self.scheduler.is_idle() {
                match self.commands.recv().await {
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            while let Ok(command) = self.commands.try_recv() {
                self.handle(command);
            }
            self.retire_abandoned();
            if let Some(reason) = self.health.failure() {
                self.fail_everything(&reason);
            }
            if !self.scheduler.is_idle() {
                self.step().await;
            }
            self.publish_metrics();
            // Let the host's other tasks (the streams' consumers, in the browser) run.
            YieldNow(false).await;
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(sequences) => self.scheduler.waiting.extend(sequences),
            Command::Abort(rid) => {
                let all = self.scheduler.running.iter_mut().chain(self.scheduler.waiting.iter_mut());
                for seq in all.filter(|s| s.request.rid == rid) {
                    seq.abort();
                }
                self.emit_and_retire();
            }
            Command::FlushCache(reply) => {
                self.cache.flush_prefix_cache();
                // The caller reads the metrics next: they must show the flush.
                self.publish_metrics();
                let _ = reply.send(());
            }
            #[cfg(feature = "fault-injection")]
            Command::Inject(Fault::DestroyDevice) => self.model.gpu().device().destroy(),
            #[cfg(feature = "fault-injection")]
            Command::Inject(fault) => self.faults.push(fault),
        }
    }

    /// Fails every running and waiting sequence: the GPU can no longer be trusted.
    fn fail_everything(&mut self, reason: &str) {
        let all = self.scheduler.running.iter_mut().chain(self.scheduler.waiting.iter_mut());
        for seq in all {
            seq.fail(Error::Unhealthy(reason.to_string()));
        }
        self.emit_and_retire();
    }

    /// Takes an injected fault that `matches`, if there is one.
    #[cfg(feature = "fault-injection")]
    fn take_fault(&mut self, matches: impl Fn(&Fault) -> bool) -> bool {
        let found = self.faults.iter().position(matches);
        found.map(|index| self.faults.remove(index)).is_some()
    }

    /// Drops the sequences whose streams were dropped, freeing their blocks.
    fn retire_abandoned(&mut self) {
        let cache = &mut self.cache;
        self.scheduler.running.retain_mut(|seq| {
            let keep = !seq.request.abandoned();
            if !keep && let Some(table) = seq.table.take() {
                cache.release(table);
            }
            keep
        });
        self.scheduler.waiting.retain(|seq| !seq.request.abandoned());
    }

    /// One forward pass over the planned batch, sampling, and the new outputs.
    async fn step(&mut self) {
        let started = Instant::now();
        let planned = self.scheduler.schedule(&mut self.cache);
        if planned.is_empty() {
            // Nothing fits even with every other sequence preempted: the head of the queue
            // needs more KV cache than there is.
            if let Some(mut seq) = self.scheduler.waiting.pop_front() {
                let error = Error::KvCacheFull {
                    needed_blocks: seq.tokens.len().div_ceil(self.cache.block_size_tokens()),
                    free_blocks: self.cache.free_blocks(),
                    block_size_tokens: self.cache.block_size_tokens(),
                };
                seq.fail(error);
                self.scheduler.waiting.push_front(seq);
            }
            return;
        }
        // A panic in the forward pass (a kernel launcher's bug) is caught here and fails the
        // step's sequences like an error would; their blocks are released, and the cache and
        // scheduler hold nothing of the step that unwound. On wasm32 panics abort: there is
        // nothing to catch, and the page's engine is gone.
        let outcome = AssertUnwindSafe(self.run_planned(&planned)).catch_unwind().await;
        if !matches!(outcome, Ok(Ok(_))) {
            // A lost device fails steps (wgpu even panics on some calls) before its lost
            // callback runs: wgpu runs the callback when polled.
            let _ = self.model.gpu().device().poll(wgpu::PollType::Poll);
        }
        let generated = match outcome {
            Ok(Ok(generated)) => generated,
            Ok(Err(error)) => {
                if matches!(error, Error::Gpu(_) | Error::Readback(_)) {
                    self.health.fail(format!("a step failed on the GPU: {error}"));
                }
                self.fail_planned(&planned, &error.to_string());
                0
            }
            Err(payload) => {
                self.fail_planned(&planned, &format!("it panicked: {}", panic_message(&*payload)));
                0
            }
        };
        self.counters.record_step(started, generated);
        self.emit_and_retire();
    }

    /// Fails the sequences of a step that failed with `message`.
    fn fail_planned(&mut self, planned: &[Planned], message: &str) {
        for p in planned {
            self.scheduler.running[p.seq].fail(Error::StepFailed(message.to_string()));
        }
    }

    /// Runs the forward pass of `planned`, then samples for every sequence whose chunk reached
    /// its last token. Returns the number of tokens sampled.
    ///
    /// When every row of logits is there to be sampled and each draw is greedy or top-k (see
    /// [`Sequence::samples_from_candidates`]), the pass ends with the search for each row's most
    /// likely tokens and only those are read back; a row whose candidates do not decide its
    /// draw is read back alone. Otherwise (prompt log-probabilities, logprobs, penalties,
    /// sampling from every token) the whole logits are read back.
    ///
    /// A sequence under a structured-output constraint computes the tokens its grammar allows
    /// while the GPU runs the pass, and draws among those only: from its candidates when one of
    /// them is allowed (the draw is then the same as from the masked row), else from its row.
    /// Unconstrained sequences in the batch draw exactly as they would without it.
    async fn run_planned(&mut self, planned: &[Planned]) -> Result<usize> {
        #[cfg(feature = "fault-injection")]
        if self.take_fault(|fault| *fault == Fault::PanicInForwardPass) {
            panic!("fault injected: a panic in the forward pass");
        }
        let vocab = self.model.config().vocab_size;
        let running = &self.scheduler.running;
        let depth = candidate_depth(planned, running);
        let (logits, candidates) = {
            let chunks = planned
                .iter()
                .map(|p| {
                    let seq = &running[p.seq];
                    let table = seq.table.as_ref().ok_or_else(|| {
                        Error::InvalidBatch(format!("sequence {} is planned without a block table", seq.id))
                    })?;
                    Ok(SequenceChunk {
                        table,
                        tokens: &seq.tokens[p.positions.clone()],
                        first_position: p.positions.start,
                        logits: p.logits,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            self.model.forward_then(&self.cache, &chunks, |ctx, encoder, logits| {
                let Some(depth) = depth else { return Ok(None) };
                let rows = logits.shape()[0];
                let out = Tensor::empty(ctx, "candidates", &[rows, depth.words_per_row()])?;
                top_candidates(ctx, encoder, logits, depth, &out)?;
                Ok(Some((out, depth)))
            })?
        };
        // The GPU runs the step now: meanwhile, the constrained sequences about to draw find
        // the tokens their grammars allow.
        for p in planned.iter().filter(|p| p.rows() > 0) {
            let seq = &mut self.scheduler.running[p.seq];
            if p.positions.end == seq.tokens.len()
                && let Err(error) = seq.prepare_constraint()
            {
                seq.fail(error);
            }
        }
        let ctx = self.model.gpu().clone();
        let (rows, candidates) = match candidates {
            Some((out, depth)) => (Vec::new(), RowCandidates::parse(&out.to_u32(&ctx).await?, depth)),
            None if planned.iter().any(|p| p.rows() > 0) => (logits.to_f32(&ctx).await?, Vec::new()),
            None => (Vec::new(), Vec::new()),
        };
        let mut generated = 0;
        let mut first_row = 0;
        for p in planned {
            #[cfg(feature = "fault-injection")]
            let panics = {
                let rid = self.scheduler.running[p.seq].request.rid.clone();
                let samples_now =
                    p.rows() > 0 && p.positions.end == self.scheduler.running[p.seq].tokens.len();
                samples_now && self.take_fault(|fault| *fault == Fault::PanicWhileSampling(rid.clone()))
            };
            let seq = &mut self.scheduler.running[p.seq];
            let row_range = first_row..first_row + p.rows();
            first_row += p.rows();
            if p.logits == LogitRows::All {
                seq.collect_input_logprobs(
                    p.positions.start,
                    &rows[row_range.start * vocab..row_range.end * vocab],
                    vocab,
                );
            }
            seq.computed = p.positions.end;
            if self.prefix_cache
                && let Some(table) = seq.table.as_mut()
            {
                self.cache.cache_prefix(table, &seq.tokens[..seq.computed]);
            }
            if seq.computed < seq.tokens.len() || p.rows() == 0 || seq.finish.is_some() {
                continue;
            }
            let last = row_range.end - 1;
            // A panic while sampling (the sampler's bug) fails this sequence alone.
            let from_candidates = std::panic::catch_unwind(AssertUnwindSafe(|| {
                #[cfg(feature = "fault-injection")]
                if panics {
                    panic!("fault injected: a panic while sampling");
                }
                candidates.get(last).map(|row| seq.sample_next_from(&self.tokenizer, row))
            }));
            let sampled = match from_candidates {
                Ok(Some(Ok(true))) => Ok(()),
                Ok(Some(Err(error))) => Err(error),
                Ok(Some(Ok(false))) => match read_row(&ctx, &logits, last, vocab).await {
                    Ok(row) => sample_guarded(|| seq.sample_next(&self.tokenizer, &row)),
                    Err(error) => Err(error),
                },
                Ok(None) => sample_guarded(|| {
                    seq.sample_next(&self.tokenizer, &rows[last * vocab..(last + 1) * vocab])
                }),
                Err(payload) => {
                    Err(Error::StepFailed(format!("sampling panicked: {}", panic_message(&*payload))))
                }
            };
            match sampled {
                Ok(()) => generated += 1,
                Err(error) => seq.fail(error),
            }
        }
        Ok(generated)
    }

    /// Sends every sequence's new output, and retires finished sequences (freeing their blocks).
    /// The metrics are published before the outputs leave, so a caller that has its request's
    /// last item sees the request retired in them.
    fn emit_and_retire(&mut self) {
        let mut outputs = Vec::new();
        let mut take = |seq: &mut Sequence| {
            if let Some(item) = seq.take_output() {
                outputs.push((seq.request.output.clone(), item));
            }
        };
        let cache = &mut self.cache;
        self.scheduler.running.retain_mut(|seq| {
            take(seq);
            let finished = seq.finish.is_some();
            if finished && let Some(table) = seq.table.take() {
                cache.release(table);
            }
            !finished
        });
        self.scheduler.waiting.retain_mut(|seq| {
            take(seq);
            seq.finish.is_none()
        });
        self.publish_metrics();
        for (output, item) in outputs {
            // A closed stream is retired at the next step.
            let _ = output.try_send(Ok(item));
        }
    }

    /// Publishes the metrics. Out of work, the steps' pooled buffers are freed first, so that an
    /// engine reported idle holds only its weights and KV cache.
    fn publish_metrics(&self) {
        if self.scheduler.is_idle() {
            self.model.gpu().free_idle_buffers();
        }
        let c = &self.counters;
        let admitted = &self.scheduler.stats;
        let metrics = EngineMetrics {
            running_sequences: self.scheduler.running.len(),
            waiting_sequences: self.scheduler.waiting.len(),
            kv_blocks_total: self.cache.num_blocks(),
            kv_blocks_used: self.cache.used_blocks(),
            kv_blocks_cached: self.cache.cached_blocks(),
            kv_blocks_free: self.cache.free_blocks(),
            kv_block_tokens: self.cache.block_size_tokens(),
            prompt_tokens: admitted.prompt_tokens,
            cached_prompt_tokens: admitted.cached_prompt_tokens,
            prefix_cache_hit_rate: if admitted.prompt_tokens > 0 {
                admitted.cached_prompt_tokens as f64 / admitted.prompt_tokens as f64
            } else {
                0.0
            },
            generated_tokens: c.generated_tokens,
            generation_tokens_per_second: c.rate(),
            steps: c.steps,
            preemptions: admitted.preemptions,
            healthy: self.health.failure().is_none(),
        };
        if let Ok(mut shared) = self.metrics.lock() {
            *shared = metrics;
        }
    }
}

/// How deep the GPU's candidate search must go for the rows of `planned`: `None` when some row
/// is needed whole, or there are no rows.
fn candidate_depth(planned: &[Planned], running: &[Sequence]) -> Option<CandidateDepth> {
    let mut deepest = None;
    for p in planned.iter().filter(|p| p.rows() > 0) {
        let seq = &running[p.seq];
        let sampled_now = p.logits == LogitRows::Last && p.positions.end == seq.tokens.len();
        let needed = seq.samples_from_candidates().filter(|_| sampled_now)?;
        // A constrained draw takes the best allowed candidate: the deeper the search, the less
        // often the row is read back because no candidate is allowed.
        let depth =
            if needed == 1 && !seq.is_constrained() { CandidateDepth::Best } else { CandidateDepth::Top };
        deepest = Some(match deepest {
            Some(CandidateDepth::Top) => CandidateDepth::Top,
            _ => depth,
        });
    }
    deepest
}

/// Runs a draw, turning a panic into the sequence's error.
fn sample_guarded(draw: impl FnOnce() -> Result<()>) -> Result<()> {
    std::panic::catch_unwind(AssertUnwindSafe(draw)).unwrap_or_else(|payload| {
        Err(Error::StepFailed(format!("sampling panicked: {}", panic_message(&*payload))))
    })
}

/// Row `row` of `logits` `[rows, vocab]`, read back alone.
async fn read_row(ctx: &GpuContext, logits: &Tensor, row: usize, vocab: usize) -> Result<Vec<f32>> {
    let bytes = ctx.read_bytes(logits.buffer(), (row * vocab * 4) as u64, (vocab * 4) as u64).await?;
    Ok(bytemuck::pod_collect_to_vec(&bytes))
}

/// Yields once to the executor.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
