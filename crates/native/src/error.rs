//! The one error type of flint-native.

/// Everything a call on [`LLM`](crate::LLM) can fail with: the engine's own errors, and the
/// ways the engine thread can be gone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine rejected or failed the call: a bad request parameter (the error names the
    /// field), a model file it cannot read, no GPU, a failed step.
    #[error(transparent)]
    Core(#[from] flint_core::Error),
    /// [`LLM::shutdown`](crate::LLM::shutdown) was called (or the `LLM` was dropped) before or
    /// while this call ran.
    #[error("the LLM was shut down; load the model again with LLM::load to make new calls")]
    ShutDown,
    /// Code on the engine thread panicked: the engine stopped, and every call waiting on it and
    /// every later call fails with this error.
    #[error("the engine thread panicked ({message}); load the model again with LLM::load")]
    EnginePanicked {
        /// The panic's message.
        message: String,
    },
    /// A blocking call was made from the engine thread itself (inside a future given to
    /// [`LLM::run`](crate::LLM::run)), where it would wait for itself forever.
    #[error(
        "a blocking LLM call was made on the engine thread (inside LLM::run), where it would wait for \
         itself; use the Engine handle that run passes instead"
    )]
    OnEngineThread,
    /// The operating system could not start the engine thread.
    #[error("could not start the engine thread: {0}")]
    Thread(#[source] std::io::Error),
    /// [`LLM::generate`](crate::LLM::generate) returns one output, but the request asks for several.
    #[error(
        "the request asks for {outputs} outputs (prompts × n), and generate returns one: use \
         generate_all or generate_stream"
    )]
    ManyOutputs {
        /// Prompts in the request times samples per prompt.
        outputs: usize,
    },
}

/// Result with flint-native's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
