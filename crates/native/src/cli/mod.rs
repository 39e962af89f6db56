//! The subcommands of `flint`, one module each (bench's engine variant has one of its own),
//! and how they find and load a model.

pub mod bench;
pub mod chat;
pub mod engine_bench;
pub mod generate;
pub mod gpu;
pub mod inspect;
pub mod model;
pub mod perplexity;
pub mod serve;
pub mod synth;
