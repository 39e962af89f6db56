//! flint for native programs: [`LLM`], a language model served by flint's engine on a
//! background thread, behind blocking calls that any thread can make.
//!
//! ```no_run
//! # fn main() -> flint_native::Result<()> {
//! use flint_native::{GenerateRequest, LLM, LoadOptions, Prompts, SamplingParams};
//!
//! let llm = LLM::load("SmolLM2-135M-Instruct.Q4_1.gguf", LoadOptions::default())?;
//! let request = GenerateRequest {
//!     text: Some(Prompts::One("The capital of France is".into())),
//!     sampling: SamplingParams { temperature: 0.0, max_new_tokens: 32, ..Default::default() },
//!     ..Default::default()
//! };
//! for piece in llm.generate_stream(request) {
//!     print!("{}", piece?.text);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The request and output types are the engine's (see "The request contract" in ARCHITECTURE.md);
//! they are re-exported here, so a program needs no other flint crate.

mod error;
mod llm;
pub mod server;

pub use error::{Error, Result};
pub use llm::{GenerationIter, LLM, LoadOptions, LoadStage};

pub use flint_core;
pub use flint_core::chat::ChatMessage;
pub use flint_core::engine::{
    Embeddings, Engine, EngineMetrics, EngineOptions, FinishReason, GenerateOutput, GenerateRequest,
    MetaInfo, Prompts, StopMatch,
};
pub use flint_core::gpu::GpuOptions;
pub use flint_core::sample::SamplingParams;

/// The example in the repository's README, compiled as a doc test.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeExample;
