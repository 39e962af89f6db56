//! Chat templates: a conversation turned into the prompt text a chat model was trained on.
//!
//! The template is the Jinja source in `tokenizer.chat_template`, rendered with MiniJinja the
//! way Hugging Face's `apply_chat_template` renders it: `trim_blocks` and `lstrip_blocks` on,
//! Python's string methods (`.strip()`, `.startswith()`, `.split()`...) through
//! `minijinja-contrib`'s pycompat, `raise_exception(message)` to reject a conversation,
//! `tojson` (as `transformers` writes JSON), `break`/`continue` in loops. The context has
//! `messages` (each with `role` and `content`; an assistant's `tool_calls` and a tool's
//! `tool_call_id` as OpenAI writes them), `tools` when a request offers some, `add_generation_prompt`,
//! and the vocabulary's `bos_token` and `eos_token`. How a template's model writes tool calls,
//! and reading them back, is [`ToolCallFormat`]'s.
//!
//! Message contents are values, never template source: Jinja written in a message is
//! rendered as the literal text it is. The template itself comes from the model file, so it
//! is treated as hostile too: compile and render errors are values, and rendering runs on a
//! fuel budget, so a template cannot loop without end.
//!
//! The rendered prompt holds special tokens as text (`<|im_start|>`): encode it with
//! `parse_special`. When the template writes `bos_token` itself and the tokenizer also adds
//! BOS, encode without `add_special` (or the prompt starts with two BOS tokens).
//!
//! ```no_run
//! # fn main() -> flint_core::Result<()> {
//! use flint_core::chat::{ChatMessage, ChatTemplate};
//! use flint_core::gguf::GgufFile;
//! use flint_core::tokenizer::Tokenizer;
//!
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokenizer = Tokenizer::from_gguf(&file)?;
//! let template = ChatTemplate::from_gguf(&file, &tokenizer)?.expect("SmolLM2 has a template");
//! let prompt = template.render(&[ChatMessage::system("Be brief."), ChatMessage::user("Hi!")], true)?;
//! assert!(prompt.ends_with("<|im_start|>assistant\n"));
//! let ids = tokenizer.encode(&prompt, true, true);
//! # Ok(())
//! # }
//! ```

mod tools;

use minijinja::{Environment, ErrorKind, context};
pub use tools::{
    ParsedCall, ParsedReply, ToolCall, ToolCallEvent, ToolCallFormat, ToolCallParser, ToolChoice,
    ToolFunction,
};

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// The name the template is compiled under. It has no file extension, so MiniJinja escapes
/// nothing (a prompt is not HTML).
const TEMPLATE_NAME: &str = "chat_template";

/// Instructions one render may run: far more than a template needs for a long conversation
/// (a few hundred per message), few enough that a template that loops without end fails in
/// well under a second.
const RENDER_FUEL: u64 = 20_000_000;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// Who speaks: `system`, `user`, `assistant`, `tool` (templates may know others).
    pub role: String,
    /// What is said, as plain text.
    pub content: String,
    /// An assistant's calls to the request's tools (none in other messages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message's answer to the call of this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// An `assistant` message that calls tools, after `content` (often empty).
    pub fn assistant_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        ChatMessage { tool_calls, ..Self::new("assistant", content) }
    }

    /// A `tool` message: the result of the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { tool_call_id: Some(tool_call_id.into()), ..Self::new("tool", content) }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    environment: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// How the template teaches the model to call tools, if it renders them.
    tool_format: Option<ToolCallFormat>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template of a GGUF model (`tokenizer.chat_template`), with `bos_token` and
    /// `eos_token` from its tokenizer; `None` when the file has no template.
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<Option<Self>> {
        let Some(source) = file.metadata().optional::<&str>("tokenizer.chat_template")? else {
            return Ok(None);
        };
        let token_text = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id)).unwrap_or_default();
        Self::new(source, token_text(tokenizer.bos()), token_text(tokenizer.eos())).map(Some)
    }

    /// Compiles the Jinja template `source`; a syntax error is an [`Error::ChatTemplate`].
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut environment = Environment::new();
        environment.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(template_error)?,
        );
        environment.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.set_fuel(Some(RENDER_FUEL));
        environment.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        environment.add_filter("tojson", tojson_like_transformers);
        environment.add_template_owned(TEMPLATE_NAME, source.to_owned()).map_err(template_error)?;
        Ok(ChatTemplate {
            environment,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            tool_format: ToolCallFormat::of_template(source),
        })
    }

    /// How the template teaches the model to call tools, or `None` when it renders no tools.
    pub fn tool_format(&self) -> Option<ToolCallFormat> {
        self.tool_format
    }

    /// The prompt for `messages`; with `add_generation_prompt`, ending with the header of the
    /// assistant's next turn. A template that fails or raises is an [`Error::ChatTemplate`]
    /// carrying the template's message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`Self::render`] offering the model `tools`, as OpenAI's requests give them
    /// (`{"type": "function", "function": {"name", "description", "parameters"}}`); with none, the
    /// template's `tools` is `none`.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.environment.get_template(TEMPLATE_NAME).map_err(template_error)?;
        let tools = (!tools.is_empty()).then_some(minijinja::value::Serde(tools));
        template
            .render(context! {
                messages => minijinja::value::Serde(messages),
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(template_error)
    }

    /// A conversation as prompt tokens: rendered with the assistant's turn opened, and
    /// tokenized with its special tokens and exactly one BOS, whether the template writes it or
    /// `tokenizer` adds it.
    pub fn encode(&self, tokenizer: &Tokenizer, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_with_tools(tokenizer, messages, &[])
    }

    /// [`Self::encode`] offering the model `tools` ([`Self::render_with_tools`]).
    pub fn encode_with_tools(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<Vec<u32>> {
        let text = self.render_with_tools(messages, tools, true)?;
        let bos_text = tokenizer.bos().and_then(|id| tokenizer.token_text(id)).unwrap_or_default();
        let add_bos = bos_text.is_empty() || !text.starts_with(bos_text);
        Ok(tokenizer.encode(&text, add_bos, true))
    }
}

/// `tojson` as `transformers` defines it for chat templates: `json.dumps(value,
/// ensure_ascii=False, indent=indent)`. MiniJinja's own filter writes the same JSON except that
/// it escapes `<`, `>`, `&` and `'` for HTML, which would change the prompt (a tool description
/// "a < b" must reach the model as written), so those four escapes are undone.
fn tojson_like_transformers(
    value: &minijinja::Value,
    indent: Option<minijinja::Value>,
    options: minijinja::value::Kwargs,
) -> Result<minijinja::Value, minijinja::Error> {
    let json = minijinja::filters::tojson(value, indent, options)?;
    let json = json.as_str().unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    let mut rest = json;
    // Every backslash in JSON text starts an escape, so walking escape by escape never
    // mistakes an escaped backslash followed by "u003c" for an escaped '<'.
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        let html = [("\\u003c", '<'), ("\\u003e", '>'), ("\\u0026", '&'), ("\\u0027", '\'')]
            .into_iter()
            .find(|(code, _)| escape.starts_with(code));
        let consumed = match html {
            Some((code, character)) => {
                out.push(character);
                code.len()
            }
            None => {
                // The backslash and the character it escapes (ASCII in JSON escapes).
                let end = escape.char_indices().nth(2).map_or(escape.len(), |(end, _)| end);
                out.push_str(&escape[..end]);
                end
            }
        };
        rest = &escape[consumed..];
    }
    out.push_str(rest);
    Ok(minijinja::Value::from_safe_string(out))
}

fn template_error(error: minijinja::Error) -> Error {
    Error::ChatTemplate(error.to_string())
}

#[cfg(test)]
mod tests;
