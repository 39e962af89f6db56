//! [`LLM`]: the engine behind a blocking API, for programs without an async runtime.
//!
//! The shape is reqwest's blocking client. [`LLM::load`] starts a thread that loads the model
//! and reports success or failure before `load` returns (a bad model is an error from `load`,
//! never a zombie engine). The thread then runs one local executor holding the engine's step
//! loop and one future per call: every call sends the thread a job over a channel, the job
//! starts the call's future there, and the future answers over a channel of its own, which the
//! caller reads with `recv_blocking`. Jobs are started in the order they arrive, so requests
//! reach the engine in the order they were submitted.
//!
//! A panic on the thread (in the engine, or in a future given to [`LLM::run`]) is caught; the
//! executor and every future on it are dropped, which closes every answer channel, and each
//! waiting caller then reads why: [`Error::EnginePanicked`]. Shutting down works the same way,
//! with [`Error::ShutDown`].

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{JoinHandle, ThreadId};

use async_channel::{Receiver, Sender};
use flint_core::chat::{ChatMessage, ChatTemplate};
use flint_core::engine::{
    Embeddings, Engine, EngineMetrics, EngineOptions, GenerateOutput, GenerateRequest, LoadedModel, StepLoop,
};
use flint_core::error::panic_message;
use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::tokenizer::Tokenizer;
use futures::executor::LocalPool;
use futures::future::LocalBoxFuture;
use futures::task::LocalSpawnExt;
use futures::{FutureExt, StreamExt};

use crate::{Error, Result};

/// How to load a model: the engine's batching and caching, which GPU, who hears of progress, and
/// a chat template to use in place of the file's.
pub struct LoadOptions {
    /// How the engine batches and caches.
    pub engine: EngineOptions,
    /// Which GPU to open. The default reads `FLINT_ADAPTER` and `FLINT_PORTABLE` from the
    /// environment ([`GpuOptions::from_env`]).
    pub gpu: GpuOptions,
    /// Called on the engine thread as loading goes from one stage to the next.
    pub on_progress: Option<Box<dyn FnMut(LoadStage) + Send>>,
    /// A chat template (Jinja source) that replaces the file's own `tokenizer.chat_template`,
    /// for a model whose file has none or a wrong one, as llama.cpp's `--chat-template-file`.
    /// It sees the same variables (`messages`, `add_generation_prompt`, `bos_token` and
    /// `eos_token` from the model's tokenizer); one that does not compile makes [`LLM::load`]
    /// fail with [`flint_core::Error::ChatTemplate`].
    pub chat_template: Option<String>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            engine: EngineOptions::default(),
            gpu: GpuOptions::from_env(),
            on_progress: None,
            chat_template: None,
        }
    }
}

/// A stage of [`LLM::load`], as reported to [`LoadOptions::on_progress`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadStage {
    /// Opening the GGUF file and reading its metadata and tokenizer.
    ReadingFile,
    /// Opening the GPU device.
    OpeningGpu,
    /// Uploading the weights (they stay quantized) and allocating the KV cache.
    UploadingWeights,
    /// Weights uploaded so far: `bytes` of the `total` the model uses, reported after each tensor.
    WeightsUploaded {
        /// Bytes written to the GPU so far.
        bytes: u64,
        /// Bytes of all the weights the model uses.
        total: u64,
    },
    /// The model is on the GPU and the engine runs.
    Ready,
}

/// A language model on the GPU, served by an engine on a background thread, with blocking calls.
///
/// `LLM` is `Send + Sync`: share it between threads (by reference, or in an `Arc`); requests
/// from every thread are batched together, in the order they were submitted. Dropping the last
/// handle (the `LLM` and any [`GenerationIter`] still alive) shuts the engine down.
///
/// ```no_run
/// # fn main() -> flint_native::Result<()> {
/// use flint_native::{GenerateRequest, LLM, LoadOptions, Prompts, SamplingParams};
///
/// let llm = LLM::load("SmolLM2-135M-Instruct.Q4_1.gguf", LoadOptions::default())?;
/// let request = GenerateRequest {
///     text: Some(Prompts::One("The capital of France is".into())),
///     sampling: SamplingParams { temperature: 0.0, max_new_tokens: 16, ..Default::default() },
///     ..Default::default()
/// };
/// println!("{}", llm.generate(request)?.text);
/// # Ok(())
/// # }
/// ```
pub struct LLM {
    inner: Arc<Inner>,
}

/// What every handle shares. Its `Drop` shuts the engine thread down.
struct Inner {
    /// The engine's handle and what callers read without the thread: metrics, tokenizer, chat
    /// template, context.
    model: LoadedModel,
    /// Jobs for the engine thread; closing it stops the thread.
    jobs: Sender<Job>,
    status: Arc<Status>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
}

/// Work for the engine thread: called there, in arrival order, with the engine; the future it
/// returns runs there to completion (or until the thread stops).
type Job = Box<dyn FnOnce(&Engine) -> LocalBoxFuture<'static, ()> + Send>;

/// Whether the engine thread serves calls, and if not, why not.
struct Status {
    state: Mutex<State>,
    /// Signalled when the state leaves `Running`.
    stopped: Condvar,
}

enum State {
    Running,
    ShutDown,
    Panicked(String),
}

impl Status {
    fn new() -> Self {
        Status { state: Mutex::new(State::Running), stopped: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ok while the engine runs; else the error every call now gets.
    fn check(&self) -> Result<()> {
        State::result(&self.lock())
    }

    /// The error of a call whose answer channel closed without an answer: the engine thread is
    /// stopping. A panic drops the future being polled while it unwinds, before the thread
    /// records it, so this waits for the record.
    fn stopped(&self) -> Error {
        let state = self.lock();
        let state = self
            .stopped
            .wait_while(state, |state| matches!(state, State::Running))
            .unwrap_or_else(PoisonError::into_inner);
        State::result(&state).err().unwrap_or(Error::ShutDown)
    }

    /// Records why the engine stopped; the first reason stays.
    fn stop(&self, why: State) {
        let mut state = self.lock();
        if matches!(*state, State::Running) {
            *state = why;
            self.stopped.notify_all();
        }
    }
}

impl State {
    fn result(&self) -> Result<()> {
        match self {
            State::Running => Ok(()),
            State::ShutDown => Err(Error::ShutDown),
            State::Panicked(message) => Err(Error::EnginePanicked { message: message.clone() }),
        }
    }
}

impl LLM {
    /// Loads a GGUF model onto the GPU and starts its engine. Blocks until the model is loaded;
    /// a file that cannot be read, an unsupported model or no GPU is an error here.
    pub fn load(path: impl AsRef<Path>, options: LoadOptions) -> Result<LLM> {
        let path = path.as_ref().to_path_buf();
        let (ready, loaded) = async_channel::bounded(1);
        let (jobs, job_receiver) = async_channel::unbounded();
        let status = Arc::new(Status::new());
        let thread_status = status.clone();
        let thread = std::thread::Builder::new()
            .name("flint-engine".into())
            .spawn(move || engine_thread(path, options, ready, job_receiver, thread_status))
            .map_err(Error::Thread)?;
        let thread_id = thread.thread().id();
        let loaded = match loaded.recv_blocking() {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(error);
            }
            Err(_) => {
                // The thread ended without a word: it panicked outside the guarded code.
                let message = thread.join().err().map_or_else(|| "unknown".into(), |p| panic_message(&*p));
                return Err(Error::EnginePanicked { message });
            }
        };
        Ok(LLM {
            inner: Arc::new(Inner {
                model: loaded,
                jobs,
                status,
                thread: Mutex::new(Some(thread)),
                thread_id,
            }),
        })
    }

    /// Generates the one output of `request` (one prompt, `n` = 1) and returns it when it is
    /// complete. The request's `stream` flag is ignored.
    pub fn generate(&self, request: GenerateRequest) -> Result<GenerateOutput> {
        let prompts = match (&request.text, &request.input_ids) {
            (Some(text), None) => text.as_slice().len(),
            (None, Some(ids)) => ids.as_slice().len(),
            // The engine names what is wrong.
            _ => 1,
        };
        // Saturating: `n` is checked by the engine, after this.
        let outputs = prompts.saturating_mul(request.sampling.n);
        if outputs > 1 {
            return Err(Error::ManyOutputs { outputs });
        }
        let mut all = self.generate_all(request)?;
        match all.pop() {
            Some(output) if all.is_empty() => Ok(output),
            _ => {
                Err(flint_core::Error::EngineStopped("it ended the request without its output".into()).into())
            }
        }
    }

    /// Generates every output of `request` (one per prompt and sample) and returns them when
    /// all are complete, in order of [`GenerateOutput::index`]. The request's `stream` flag is
    /// ignored.
    pub fn generate_all(&self, mut request: GenerateRequest) -> Result<Vec<GenerateOutput>> {
        request.stream = false;
        let mut outputs = self.submit(request).collect::<Result<Vec<_>>>()?;
        outputs.sort_by_key(|output| output.index);
        Ok(outputs)
    }

    /// Streams `request`'s outputs as tokens are generated: each item carries the text and
    /// token ids new since the previous item of the same sequence, and the last item of each
    /// sequence its finish reason. The request's `stream` flag is set.
    ///
    /// Errors are items too (an invalid request yields one error and ends). Dropping the
    /// iterator before its end aborts the request and frees its KV blocks.
    pub fn generate_stream(&self, mut request: GenerateRequest) -> GenerationIter {
        request.stream = true;
        self.submit(request)
    }

    /// Queues `request` as it is and returns its outputs as they come: items as tokens are
    /// generated with `stream: true`, one item per sequence at its end otherwise.
    fn submit(&self, request: GenerateRequest) -> GenerationIter {
        let (sender, items) = async_channel::unbounded();
        let (cancel, cancelled) = futures::channel::oneshot::channel::<()>();
        let job: Job = Box::new(move |engine| {
            let mut stream = engine.generate(request);
            async move {
                let forward = async move {
                    while let Some(item) = stream.next().await {
                        if sender.send(Message::Item(Box::new(item.map_err(Error::from)))).await.is_err() {
                            return;
                        }
                    }
                    let _ = sender.send(Message::End).await;
                };
                // The iterator's drop drops `cancel`: this future then ends, and with it the
                // engine's stream, which aborts the request at the engine's next step.
                futures::future::select(pin!(forward), cancelled).await;
            }
            .boxed_local()
        });
        match self.inner.submit(job) {
            Ok(()) => {
                GenerationIter { items, _cancel: Some(cancel), inner: Some(self.inner.clone()), ended: false }
            }
            Err(error) => GenerationIter::failed(error),
        }
    }

    /// The embeddings of `texts` ([`Engine::embed`]): each tokenized with the model's special
    /// tokens, its final hidden states pooled as the model's file says (the mean unless it
    /// says otherwise) and scaled to unit length, in the order of `texts`.
    ///
    /// ```no_run
    /// # fn main() -> flint_native::Result<()> {
    /// let llm = flint_native::LLM::load("Qwen3-Embedding-0.6B-Q8_0.gguf", Default::default())?;
    /// let embeddings = llm.embed(&["What is the capital of France?", "Paris"])?;
    /// let cosine: f32 = embeddings.vectors[0].iter().zip(&embeddings.vectors[1]).map(|(a, b)| a * b).sum();
    /// # Ok(())
    /// # }
    /// ```
    pub fn embed(&self, texts: &[&str]) -> Result<Embeddings> {
        let inputs: Vec<Vec<u32>> =
            texts.iter().map(|text| self.tokenizer().encode(text, true, false)).collect();
        Ok(self.run(move |engine| async move { engine.embed(inputs).await })??)
    }

    /// Runs `call` on the engine thread with a handle on the engine, and blocks until the
    /// future it returns completes: for any engine call the facade has no method for.
    ///
    /// ```no_run
    /// # fn main() -> flint_native::Result<()> {
    /// # let llm = flint_native::LLM::load("model.gguf", Default::default())?;
    /// llm.run(|engine| async move { engine.flush_cache().await })??;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A panic in `call` or its future stops the engine: this call and every other waiting one
    /// fail with [`Error::EnginePanicked`].
    pub fn run<F, Fut, T>(&self, call: F) -> Result<T>
    where
        F: FnOnce(Engine) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = async_channel::bounded(1);
        self.inner.submit(Box::new(move |engine| {
            let future = call(engine.clone());
            async move {
                let _ = reply.send(future.await).await;
            }
            .boxed_local()
        }))?;
        answer.recv_blocking().map_err(|_| self.inner.status.stopped())
    }

    /// A handle on the engine, for async code: its futures and streams run on the caller's
    /// executor, while the step loop stays on the engine thread. Fails once the engine stopped.
    pub fn engine(&self) -> Result<Engine> {
        self.inner.status.check()?;
        Ok(self.inner.model.engine().clone())
    }

    /// What the engine is doing, as of its last step.
    pub fn metrics(&self) -> Result<EngineMetrics> {
        self.inner.status.check()?;
        Ok(self.inner.model.engine().metrics())
    }

    /// Ok while the engine serves calls; else the error calls get: shut down, panicked, or
    /// unhealthy ([`flint_core::Error::Unhealthy`]: its GPU failed, and the model must be
    /// loaded again with [`LLM::load`]).
    pub fn health(&self) -> Result<()> {
        self.inner.status.check()?;
        Ok(self.inner.model.engine().health()?)
    }

    /// The model's tokenizer (it works after shutdown too).
    pub fn tokenizer(&self) -> &Tokenizer {
        self.inner.model.engine().tokenizer()
    }

    /// The most tokens one sequence may hold, prompt and generated tokens together: the model's
    /// context, or the KV cache's capacity when that is smaller.
    pub fn max_sequence_tokens(&self) -> usize {
        self.inner.model.max_sequence_tokens()
    }

    /// The model's chat template, or an error saying why it has none.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        Ok(self.inner.model.chat_template()?)
    }

    /// A conversation as prompt tokens: rendered through the model's chat template with the
    /// assistant's turn opened, and tokenized with its special tokens (one BOS, whether the
    /// template writes it or the tokenizer adds it).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        Ok(self.inner.model.encode_chat(messages)?)
    }

    /// Stops the engine: calls waiting on it fail with [`Error::ShutDown`], later calls too.
    /// Returns when the engine thread has ended (the model's GPU memory is freed). Calling it
    /// again does nothing; dropping the last handle does it too.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Inner {
    /// Hands a job to the engine thread.
    fn submit(&self, job: Job) -> Result<()> {
        if std::thread::current().id() == self.thread_id {
            return Err(Error::OnEngineThread);
        }
        self.status.check()?;
        // Unbounded: never blocks. Fails once the thread stopped taking jobs.
        self.jobs.send_blocking(job).map_err(|_| self.status.stopped())
    }

    fn shutdown(&self) {
        self.status.stop(State::ShutDown);
        self.jobs.close();
        let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        // The last handle may be dropped on the engine thread itself (by a future given to
        // `run`): it cannot wait for itself, and ends once that future returns.
        if let Some(thread) = thread
            && thread.thread().id() != std::thread::current().id()
        {
            // A panic there was caught and recorded already.
            let _ = thread.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What the forwarding future sends a [`GenerationIter`].
enum Message {
    /// Boxed: an output is large, the end marker small.
    Item(Box<Result<GenerateOutput>>),
    /// The request's stream ended; without it, a closed channel means the engine stopped.
    End,
}

/// The outputs of a request, as a blocking iterator (see [`LLM::generate_stream`]).
///
/// Each `next` blocks until an item comes. The iterator ends after the request's last item;
/// when the engine stops first, it yields the reason as an error, then ends. Dropping it
/// before its end aborts the request. It keeps the engine running while it lives, even when
/// the `LLM` itself is dropped.
pub struct GenerationIter {
    items: Receiver<Message>,
    /// Dropped with the iterator, which tells the engine thread to abort the request.
    _cancel: Option<futures::channel::oneshot::Sender<()>>,
    inner: Option<Arc<Inner>>,
    ended: bool,
}

impl GenerationIter {
    /// An iterator that yields `error` and ends.
    fn failed(error: Error) -> Self {
        let (sender, items) = async_channel::unbounded();
        // Unbounded and open: cannot fail.
        let _ = sender.try_send(Message::Item(Box::new(Err(error))));
        let _ = sender.try_send(Message::End);
        GenerationIter { items, _cancel: None, inner: None, ended: false }
    }
}

impl Iterator for GenerationIter {
    type Item = Result<GenerateOutput>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        if let Some(inner) = &self.inner
            && std::thread::current().id() == inner.thread_id
        {
            self.ended = true;
            return Some(Err(Error::OnEngineThread));
        }
        match self.items.recv_blocking() {
            Ok(Message::Item(item)) => Some(*item),
            Ok(Message::End) => {
                self.ended = true;
                None
            }
            Err(_) => {
                self.ended = true;
                let error = self.inner.as_ref().map_or(Error::ShutDown, |inner| inner.status.stopped());
                Some(Err(error))
            }
        }
    }
}

/// The engine thread: loads the model, reports how that went, then runs the step loop and
/// every call's future until the job channel closes or something panics.
fn engine_thread(
    path: PathBuf,
    options: LoadOptions,
    ready: Sender<Result<LoadedModel>>,
    jobs: Receiver<Job>,
    status: Arc<Status>,
) {
    let started = panic::catch_unwind(AssertUnwindSafe(|| load_engine(&path, options)))
        .unwrap_or_else(|payload| Err(Error::EnginePanicked { message: panic_message(&*payload) }));
    let (loaded, step_loop) = match started {
        Ok(started) => started,
        Err(error) => {
            let _ = ready.send_blocking(Err(error));
            return;
        }
    };
    let engine = loaded.engine().clone();
    if ready.send_blocking(Ok(loaded)).is_err() {
        return;
    }
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    let receive_jobs = {
        let spawner = spawner.clone();
        async move {
            while let Ok(job) = jobs.recv().await {
                // Fails only when the pool is gone, and then nothing waits for the job.
                let _ = spawner.spawn_local(job(&engine));
            }
        }
    };
    let _ = spawner.spawn_local(step_loop.run());
    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| pool.run_until(receive_jobs))) {
        status.stop(State::Panicked(panic_message(&*payload)));
    }
    status.stop(State::ShutDown);
    // Dropping the pool drops every call's future, closing the channels their callers wait
    // on; they read the status set above. A panic while dropping has nobody left to tell.
    let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(pool)));
}

/// Opens the file and the GPU, and loads the engine, reporting each stage.
fn load_engine(path: &Path, options: LoadOptions) -> Result<(LoadedModel, StepLoop)> {
    let LoadOptions { engine: engine_options, gpu, mut on_progress, chat_template } = options;
    let mut report = |stage| {
        if let Some(on_progress) = on_progress.as_mut() {
            on_progress(stage);
        }
    };
    report(LoadStage::ReadingFile);
    let file = GgufFile::open(path)?;
    report(LoadStage::OpeningGpu);
    let ctx = futures::executor::block_on(GpuContext::new(&gpu))?;
    report(LoadStage::UploadingWeights);
    let described = format!("the model file '{}'", path.display());
    let mut upload =
        LoadedModel::begin_load(ctx, &file, engine_options, &described, chat_template.as_deref())?;
    let total = upload.weights().remaining_bytes();
    while upload.weights().write_next_from(&file)? {
        report(LoadStage::WeightsUploaded { bytes: total - upload.weights().remaining_bytes(), total });
    }
    let loaded = upload.finish()?;
    report(LoadStage::Ready);
    Ok(loaded)
}
