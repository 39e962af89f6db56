//! [`LoadedModel`]: an engine with what its front ends (the native facade and the web package)
//! read of the loaded model besides requests: its configuration, how long a sequence may grow,
//! and its chat template.

use std::sync::Arc;

use crate::chat::{ChatMessage, ChatTemplate};
use crate::engine::{Engine, EngineOptions, StepLoop};
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::model::ModelConfig;
use crate::{Error, Result};

/// A model loaded onto a GPU and served by an [`Engine`].
pub struct LoadedModel {
    engine: Engine,
    config: ModelConfig,
    /// The chat template, or why there is none (an error only when a chat is asked for).
    chat_template: std::result::Result<ChatTemplate, String>,
}

impl LoadedModel {
    /// Loads `file`'s model onto `ctx` as [`Engine::load`] does, and reads its chat template;
    /// `described` names the model in the errors about its template ("the model file 'x.gguf'").
    pub fn load(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        options: EngineOptions,
        described: &str,
    ) -> Result<(LoadedModel, StepLoop)> {
        let config = ModelConfig::from_gguf(file)?;
        let (engine, step_loop) = Engine::load(ctx, file, options)?;
        let chat_template = match ChatTemplate::from_gguf(file, engine.tokenizer()) {
            Ok(Some(template)) => Ok(template),
            Ok(None) => {
                Err(format!("{described} has no chat template (tokenizer.chat_template): use a chat model"))
            }
            Err(error) => Err(format!("{described} has a chat template flint cannot use: {error}")),
        };
        Ok((LoadedModel { engine, config, chat_template }, step_loop))
    }

    /// The engine serving it.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Its hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The most tokens one sequence may hold ([`Engine::max_sequence_tokens`]).
    pub fn max_sequence_tokens(&self) -> usize {
        self.engine.max_sequence_tokens()
    }

    /// The chat template, or [`Error::ChatTemplate`] saying why there is none.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.chat_template.as_ref().map_err(|why| Error::ChatTemplate(why.clone()))
    }

    /// A conversation as prompt tokens: rendered through the chat template with the assistant's
    /// turn opened, and tokenized with its special tokens (one BOS, whether the template writes
    /// it or the tokenizer adds it).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.chat_template()?.encode(self.engine.tokenizer(), messages)
    }
}
