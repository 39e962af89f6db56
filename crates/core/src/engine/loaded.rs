//! [`LoadedModel`]: an engine with what its front ends (the native facade and the web package)
//! read of the loaded model besides requests: its configuration, how long a sequence may grow,
//! and its chat template.

use std::sync::Arc;

use crate::chat::{ChatMessage, ChatTemplate, ToolCallFormat};
use crate::engine::{Engine, EngineOptions, EngineUpload, StepLoop};
use crate::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::model::{ModelConfig, WeightUpload};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A [`LoadedModel`] whose weights are still coming ([`LoadedModel::begin_load`]).
pub struct LoadedModelUpload {
    engine: EngineUpload,
    config: ModelConfig,
    chat_template: std::result::Result<ChatTemplate, String>,
}

impl LoadedModelUpload {
    /// The model's weights, to write as their bytes come.
    pub fn weights(&mut self) -> &mut WeightUpload {
        self.engine.weights()
    }

    /// The loaded model and its engine's step loop, once every weight is written.
    pub fn finish(self) -> Result<(LoadedModel, StepLoop)> {
        let (engine, step_loop) = self.engine.finish()?;
        Ok((LoadedModel { engine, config: self.config, chat_template: self.chat_template }, step_loop))
    }
}

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
    ///
    /// `chat_template`, when given, is Jinja source used in place of the file's own template
    /// (`tokenizer.chat_template`), for a file that has none or a wrong one, as llama.cpp's
    /// `--chat-template-file`. Unlike the file's template, whose faults only fail the chats
    /// that need it, an override that does not compile is an [`Error::ChatTemplate`] here:
    /// it was given to be used.
    pub fn load(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        options: EngineOptions,
        described: &str,
        chat_template: Option<&str>,
    ) -> Result<(LoadedModel, StepLoop)> {
        let mut upload = LoadedModel::begin_load(ctx, file, options, described, chat_template)?;
        upload.weights().write_from(file)?;
        upload.finish()
    }

    /// [`LoadedModel::load`] for weights that come later, as [`Engine::begin_load`].
    pub fn begin_load(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        options: EngineOptions,
        described: &str,
        chat_template: Option<&str>,
    ) -> Result<LoadedModelUpload> {
        let config = ModelConfig::from_gguf(file)?;
        let engine = Engine::begin_load(ctx, file, options)?;
        let chat_template = match chat_template {
            Some(source) => Ok(chat_template_override(source, &engine.tokenizer, described)?),
            None => chat_template_of_file(file, &engine.tokenizer, described),
        };
        Ok(LoadedModelUpload { engine, config, chat_template })
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

    /// [`Self::encode_chat`] offering the model `tools` (OpenAI's `tools` objects).
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<Vec<u32>> {
        self.chat_template()?.encode_with_tools(self.engine.tokenizer(), messages, tools)
    }

    /// How the model writes tool calls, or `None` when its chat template renders no tools.
    pub fn tool_format(&self) -> Option<ToolCallFormat> {
        self.chat_template.as_ref().ok().and_then(ChatTemplate::tool_format)
    }
}

/// The template that replaces the file's, compiled with `bos_token` and `eos_token` from the
/// tokenizer as [`ChatTemplate::from_gguf`] does; one that does not compile is an error.
fn chat_template_override(source: &str, tokenizer: &Tokenizer, described: &str) -> Result<ChatTemplate> {
    let token_text = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id)).unwrap_or_default();
    ChatTemplate::new(source, token_text(tokenizer.bos()), token_text(tokenizer.eos())).map_err(|error| {
        let why = match error {
            Error::ChatTemplate(why) => why,
            error => error.to_string(),
        };
        Error::ChatTemplate(format!("the chat template given for {described} does not compile: {why}"))
    })
}

/// The file's own template, or why there is none (an error only when a chat is asked for).
fn chat_template_of_file(
    file: &GgufFile,
    tokenizer: &Tokenizer,
    described: &str,
) -> std::result::Result<ChatTemplate, String> {
    match ChatTemplate::from_gguf(file, tokenizer) {
        Ok(Some(template)) => Ok(template),
        Ok(None) => {
            Err(format!("{described} has no chat template (tokenizer.chat_template): use a chat model"))
        }
        Err(error) => Err(format!("{described} has a chat template flint cannot use: {error}")),
    }
}
