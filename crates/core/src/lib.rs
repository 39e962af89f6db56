//! flint-core: the engine.
//!
//! No threads and no blocking calls of its own, so it compiles to `wasm32-unknown-unknown`.
//! The layers, bottom up:
//! - [`gguf`]: the GGUF file reader (metadata, tensor infos, tensor bytes).
//! - [`quant`]: the GGML quantization formats and their CPU dequantization.
//! - [`gpu`]: the wgpu device context, buffers and the compiled-pipeline cache.
//! - [`kernels`]: the WGSL kernel library (in `shaders/`) and the Rust launchers that record them.
//! - [`grammar`]: structured output, the token masks of JSON Schemas, regexes and grammars.
//! - [`openai`]: OpenAI's request and response shapes, shared by flint's OpenAI front ends.

pub mod chat;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod gpu;
pub mod grammar;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod openai;
pub mod quant;
pub mod sample;
pub mod synth;
pub mod tokenizer;
mod tuning;

pub use error::{Error, Result};
