//! The one error type of flint-core.

/// Everything that can go wrong inside flint-core, each variant naming what was wrong and,
/// where it helps, what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No GPU adapter could be found (or none matched `FLINT_ADAPTER`).
    #[error("{0}")]
    NoAdapter(String),
    /// The adapter refused to create a device.
    #[error("could not create a GPU device on adapter '{adapter}': {reason}")]
    DeviceRequest {
        /// Name of the adapter.
        adapter: String,
        /// What wgpu reported.
        reason: String,
    },
    /// wgpu reported a validation, out-of-memory or internal error.
    #[error("GPU error: {0}")]
    Gpu(String),
    /// Mapping a buffer for readback failed.
    #[error("GPU readback failed: {0}")]
    Readback(String),
    /// A kernel was called with arguments that do not fit together.
    #[error("kernel '{kernel}': {reason}")]
    KernelArguments {
        /// The kernel's name.
        kernel: &'static str,
        /// What did not fit.
        reason: String,
    },
    /// A tensor needs more memory than the device allows in one buffer or binding.
    #[error("tensor '{name}' needs {bytes} bytes, more than the device allows: {reason}")]
    TooLarge {
        /// Tensor name or role.
        name: String,
        /// Bytes requested.
        bytes: u64,
        /// Which limit it exceeds.
        reason: String,
    },
    /// A model does not fit the device: its [`crate::model::MemoryPlan`], made before any upload,
    /// needs more than the device allows or has.
    #[error("the model does not fit: {reason} ({plan})")]
    DoesNotFit {
        /// What is too large, and what to change.
        reason: String,
        /// The plan's figures, in one line.
        plan: String,
    },
    /// A buffer would take flint's GPU memory past the budget it was given
    /// ([`crate::gpu::GpuOptions::memory_budget`]). Nothing was allocated.
    #[error(
        "out of GPU memory: '{what}' needs {requested} bytes, {in_use} are in use and the budget is {budget}; \
         raise the budget, or use a smaller batch, prompt chunk or KV cache"
    )]
    OutOfMemory {
        /// The buffer that did not fit.
        what: String,
        /// Its size in bytes.
        requested: u64,
        /// Bytes held when it was asked for.
        in_use: u64,
        /// The budget in bytes.
        budget: u64,
    },
    /// A GGUF file is malformed, truncated or unsupported.
    #[error("GGUF file {context}: {reason}")]
    Gguf {
        /// Where in the file (e.g. "header", "metadata key 'general.name'", "tensor 'blk.0.attn_q.weight'").
        context: String,
        /// What is wrong.
        reason: String,
    },
    /// The paged KV cache has too few free blocks for the tokens being appended.
    #[error(
        "the KV cache is full: {needed_blocks} more blocks of {block_size_tokens} tokens are needed but only \
         {free_blocks} are free; finish or abort a sequence, or create the cache with a larger token budget"
    )]
    KvCacheFull {
        /// Blocks the append needs.
        needed_blocks: usize,
        /// Blocks still free.
        free_blocks: usize,
        /// Tokens per block.
        block_size_tokens: usize,
    },
    /// A batch given to a model's forward pass does not fit the model or its KV cache.
    #[error("invalid batch for the forward pass: {0}")]
    InvalidBatch(String),
    /// Reading a file from disk failed.
    #[error("cannot read '{path}': {source}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A request parameter is outside its valid range.
    #[error("invalid value for '{field}': {reason}")]
    InvalidParameter {
        /// The parameter's name, as in the request contract (e.g. "top_p").
        field: &'static str,
        /// What is wrong with the value.
        reason: String,
    },
    /// A token id that is not in the tokenizer's vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfVocabulary {
        /// The id.
        id: u32,
        /// Number of tokens in the vocabulary.
        vocab_size: usize,
    },
    /// A chat template does not compile, fails to render, or raised an exception itself.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The engine step that was running a request failed (the message is the step's error);
    /// the request ends with this error while the engine goes on with the others.
    #[error("the engine step running this request failed: {0}")]
    StepFailed(String),
    /// The engine's GPU failed (the device was lost, ran out of memory, or reported an error
    /// during a step): its state cannot be trusted, so the engine fails every request.
    #[error("the engine is unhealthy: {0}; load the model again (on a new GPU device) to go on")]
    Unhealthy(String),
    /// A request's structured-output constraint failed while generating: its grammar allows no
    /// token that can be drawn. The request ends with this error.
    #[error("the output's grammar cannot go on: {0}")]
    Constraint(String),
    /// The engine's step loop is not running (it was never started, or it ended), so the
    /// request cannot be served.
    #[error("the engine is not running: {0}")]
    EngineStopped(String),
}

/// Result with flint-core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The text of a caught panic's payload (`panic!` gives a `&str` or a `String`), for the error
/// that reports it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
