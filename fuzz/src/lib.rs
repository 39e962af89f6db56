//! What the fuzz targets share: the two reference models' tokenizers and chat templates, read
//! from their GGUF files' metadata (no GPU), and the server's request parser.
//!
//! The models are the ones `scripts/fetch-models.sh` fetches (`$FLINT_MODEL_DIR`, else
//! `~/.cache/flint/models`); a missing one stops the target with a message saying so.

use std::sync::LazyLock;

use flint_core::chat::{ChatMessage, ChatTemplate};
use flint_core::gguf::GgufFile;
use flint_core::model::ModelConfig;
use flint_core::tokenizer::Tokenizer;
use flint_e2e::{MODELS, ReferenceModel};

/// `flint serve`'s request parser and its checks.
pub use flint_native::server::openai;

/// A reference model's vocabulary and chat template.
pub struct Vocabulary {
    /// Which model.
    pub model: ReferenceModel,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template (gemma3 270M, a base model, has none).
    pub template: Option<ChatTemplate>,
    /// Its context, in tokens.
    pub context_tokens: usize,
}

/// SmolLM2 (byte-level BPE, ChatML template) and gemma3 (SentencePiece), in the order of
/// [`MODELS`].
pub fn vocabularies() -> &'static [Vocabulary] {
    static VOCABULARIES: LazyLock<Vec<Vocabulary>> =
        LazyLock::new(|| MODELS.iter().map(|&m| load(m)).collect());
    &VOCABULARIES
}

fn load(model: ReferenceModel) -> Vocabulary {
    let file = GgufFile::open(model.path()).unwrap_or_else(|e| panic!("{}: {e}", model.file_name));
    let tokenizer = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", model.file_name));
    let template =
        ChatTemplate::from_gguf(&file, &tokenizer).unwrap_or_else(|e| panic!("{}: {e}", model.file_name));
    let context_tokens =
        ModelConfig::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", model.file_name)).context_length;
    Vocabulary { model, tokenizer, template, context_tokens }
}

impl openai::ServedModel for Vocabulary {
    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> flint_native::Result<Vec<u32>> {
        let template = self.template.as_ref().ok_or_else(|| {
            flint_core::Error::ChatTemplate(format!("{} has no chat template", self.model.file_name))
        })?;
        Ok(template.encode_with_tools(&self.tokenizer, messages, tools)?)
    }

    fn tool_use(
        &self,
        request: &flint_core::openai::OpenAiRequest,
    ) -> flint_core::Result<flint_core::openai::ToolUse> {
        let format = self.template.as_ref().and_then(|template| template.tool_format());
        request.tool_use(format, &self.tokenizer)
    }

    fn max_sequence_tokens(&self) -> usize {
        self.context_tokens
    }
}
