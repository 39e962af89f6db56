//! OpenAI's API as flint speaks it: the request bodies of chat completions and (legacy)
//! completions, mapped onto the engine's request contract, and the response objects and stream
//! chunks built from the engine's outputs. Both of flint's OpenAI front ends use these shapes:
//! `flint serve` (`/v1/chat/completions`, `/v1/completions`) and the web package's
//! `engine.chat.completions.create`. Reading a body, and which fields an endpoint refuses, is
//! theirs: the server takes `logprobs` and completions' `prompt`, the browser neither.
//!
//! ```
//! use flint_core::openai::OpenAiRequest;
//!
//! let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 8}"#;
//! let request: OpenAiRequest = serde_json::from_str(body).unwrap();
//! let messages = request.chat_messages().unwrap();
//! assert_eq!((messages[0].role.as_str(), messages[0].content.as_str()), ("user", "Hi"));
//! let sampling = request.sampling_params(request.max_new_tokens().unwrap_or(16)).unwrap();
//! assert_eq!((sampling.temperature, sampling.max_new_tokens), (0.0, 8));
//! ```

mod embeddings;
mod tools;

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::chat::{ChatMessage, ToolCall, ToolCallEvent, ToolCallFormat, ToolCallParser};
use crate::engine::{FinishReason, GenerateOutput};
use crate::error::{Error, Result};
use crate::sample::SamplingParams;
pub use embeddings::EmbeddingRequest;
pub use tools::{
    FunctionDefinition, FunctionName, NamedToolChoice, Tool, ToolChoiceParam, ToolKind, ToolUse,
};

/// The body of a chat completion or a completion request: the fields of both endpoints, as
/// OpenAI names them. Unknown fields are rejected, so a parameter flint does not implement is
/// never silently ignored. `top_k`, `min_p`, `repetition_penalty`, `min_tokens` and
/// `ignore_eos` are extensions (as vLLM has them). `response_format` constrains the output to
/// JSON (any object, or valid against a JSON Schema) as OpenAI's structured outputs do; flint
/// enforces a schema whether or not `strict` is set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiRequest {
    /// The model's name.
    pub model: Option<String>,
    /// Chat: the conversation so far.
    pub messages: Option<Vec<Message>>,
    /// Completions: what to continue.
    pub prompt: Option<PromptInput>,
    /// The most tokens to generate (the older name of `max_completion_tokens`).
    pub max_tokens: Option<usize>,
    /// The most tokens to generate.
    pub max_completion_tokens: Option<usize>,
    /// `SamplingParams::temperature`.
    pub temperature: Option<f32>,
    /// `SamplingParams::top_p`.
    pub top_p: Option<f32>,
    /// Samples per prompt.
    pub n: Option<usize>,
    /// Answer as a stream of chunks.
    pub stream: Option<bool>,
    /// With `stream`: what else the stream carries.
    pub stream_options: Option<StreamOptions>,
    /// Strings that end the output.
    pub stop: Option<OneOrMany<String>>,
    /// The sampler's seed; a negative one is as good as a positive one.
    pub seed: Option<i64>,
    /// `SamplingParams::frequency_penalty`.
    pub frequency_penalty: Option<f32>,
    /// `SamplingParams::presence_penalty`.
    pub presence_penalty: Option<f32>,
    /// Biases added to tokens' logits, keyed by token id written as a string.
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Chat: whether to return logprobs (a boolean); completions: alternatives per token (a
    /// number).
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token, with `logprobs: true`.
    pub top_logprobs: Option<usize>,
    /// Completions: the prompt repeated before the output.
    pub echo: Option<bool>,
    /// Completions: the text after the insertion.
    pub suffix: Option<String>,
    /// Completions: samples to draw, of which `n` are returned.
    pub best_of: Option<usize>,
    /// What the output must be: free text, any JSON object, or JSON valid against a schema.
    pub response_format: Option<ResponseFormat>,
    /// Functions the model may call ([`OpenAiRequest::tool_use`]).
    pub tools: Option<Vec<Tool>>,
    /// Whether the model may (`auto`, the default), must (`required`, or a named function) or
    /// must not (`none`) call the tools.
    pub tool_choice: Option<ToolChoiceParam>,
    /// Whether the model may make more than one call in an answer (by default it may).
    pub parallel_tool_calls: Option<bool>,
    /// An end-user id, for the caller's own bookkeeping: accepted and ignored.
    pub user: Option<String>,
    /// Whether OpenAI should store the answer: accepted and ignored (flint stores nothing).
    pub store: Option<bool>,
    /// Tags for the caller's own bookkeeping: accepted and ignored.
    pub metadata: Option<Value>,
    /// OpenAI's processing tier: accepted and ignored.
    pub service_tier: Option<String>,
    /// `SamplingParams::top_k`.
    pub top_k: Option<i32>,
    /// `SamplingParams::min_p`.
    pub min_p: Option<f32>,
    /// `SamplingParams::repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// `SamplingParams::min_new_tokens`.
    pub min_tokens: Option<usize>,
    /// `SamplingParams::ignore_eos`.
    pub ignore_eos: Option<bool>,
}

/// `stream_options`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// End the stream with a chunk of no choices that carries the request's `usage`.
    pub include_usage: Option<bool>,
}

/// One value, or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// One.
    One(T),
    /// A list.
    Many(Vec<T>),
}

/// `response_format`: free text, any JSON object, or JSON valid against a schema.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// `{"type": "text"}`: no constraint.
    Text,
    /// `{"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `{"type": "json_schema", "json_schema": {...}}`: JSON valid against the schema.
    JsonSchema {
        /// The schema and what names it.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name, for the caller's own bookkeeping: required as OpenAI requires it.
    pub name: String,
    /// What the format is for, which OpenAI shows the model: accepted and ignored.
    pub description: Option<String>,
    /// The schema; without one, any JSON value.
    pub schema: Option<Value>,
    /// OpenAI's strict mode: accepted and ignored, since flint always enforces the schema
    /// exactly.
    pub strict: Option<bool>,
}

/// `prompt`: a text, texts, token ids, or lists of token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text.
    Text(String),
    /// A batch of texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// A batch of prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// One message of a chat.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// Who speaks: `system` (or OpenAI's newer `developer`), `user`, `assistant`...
    pub role: String,
    /// What is said; none is an empty text.
    pub content: Option<Content>,
    /// A participant's name: accepted and ignored (chat templates have no place for it).
    pub name: Option<String>,
    /// An assistant's calls to tools.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
}

/// A message's content: a text, or parts of which flint takes text only.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// A text.
    Text(String),
    /// Parts, joined by newlines.
    Parts(Vec<ContentPart>),
}

/// A part of a message's content: `{"type": "text", "text": ...}` (images and audio are
/// refused).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContentPart {
    /// A text.
    Text {
        /// The text.
        text: String,
    },
}

impl OpenAiRequest {
    /// The conversation as the chat template takes it, or `None` without `messages`.
    pub fn chat_messages(&self) -> Option<Vec<ChatMessage>> {
        Some(self.messages.as_ref()?.iter().map(Message::chat_message).collect())
    }

    /// `max_completion_tokens`, or `max_tokens`, if either is given.
    pub fn max_new_tokens(&self) -> Option<usize> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// [`Self::max_new_tokens`] of a chat whose prompt has `prompt_tokens`, with OpenAI's
    /// default when neither is given: as many as the context has left (the engine ends the turn
    /// at the template's end-of-turn token first).
    pub fn chat_max_new_tokens(&self, prompt_tokens: usize, max_sequence_tokens: usize) -> usize {
        self.max_new_tokens().unwrap_or_else(|| max_sequence_tokens.saturating_sub(prompt_tokens).max(1))
    }

    /// Samples per prompt: `n`, 1 by default.
    pub fn samples(&self) -> usize {
        self.n.unwrap_or(1)
    }

    /// Whether the answer is a stream of chunks.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a stream ends with a chunk of the request's `usage`.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|options| options.include_usage).unwrap_or(false)
    }

    /// The sampling parameters of the request, generating at most `max_new_tokens`. Their ranges
    /// are the engine's to check; the one error here is a `logit_bias` key that is not a token
    /// id ([`Error::InvalidParameter`] naming `logit_bias`).
    pub fn sampling_params(&self, max_new_tokens: usize) -> Result<SamplingParams> {
        let defaults = SamplingParams::default();
        Ok(SamplingParams {
            max_new_tokens,
            min_new_tokens: self.min_tokens.unwrap_or(defaults.min_new_tokens),
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(defaults.repetition_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            stop: match &self.stop {
                None => Vec::new(),
                Some(OneOrMany::One(stop)) => vec![stop.clone()],
                Some(OneOrMany::Many(stops)) => stops.clone(),
            },
            ignore_eos: self.ignore_eos.unwrap_or(false),
            // A seed is 64 bits either way; negative ones are as good as positive ones.
            seed: self.seed.map(|seed| seed as u64),
            n: self.samples(),
            logit_bias: self.logit_bias.as_ref().map_or_else(|| Ok(BTreeMap::new()), token_id_bias)?,
            json_schema: self.response_format.as_ref().and_then(ResponseFormat::json_schema),
            ..defaults
        })
    }
}

impl Message {
    /// The message as the chat template takes it: the text parts joined by newlines, and
    /// OpenAI's `developer` role as `system` (the role chat templates know).
    pub fn chat_message(&self) -> ChatMessage {
        let content = match &self.content {
            None => String::new(),
            Some(Content::Text(text)) => text.clone(),
            Some(Content::Parts(parts)) => {
                parts.iter().map(|ContentPart::Text { text }| text.as_str()).collect::<Vec<_>>().join("\n")
            }
        };
        let role = if self.role == "developer" { "system" } else { self.role.as_str() };
        ChatMessage {
            tool_calls: self.tool_calls.clone().unwrap_or_default(),
            tool_call_id: self.tool_call_id.clone(),
            ..ChatMessage::new(role, content)
        }
    }
}

impl ResponseFormat {
    /// The JSON Schema the output must follow, if any.
    pub fn json_schema(&self) -> Option<Value> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(json!({"type": "object"})),
            ResponseFormat::JsonSchema { json_schema } => {
                Some(json_schema.schema.clone().unwrap_or_else(|| json!({})))
            }
        }
    }
}

/// The name in OpenAI's requests of a field of the engine's request contract, for the errors
/// that name it: `max_new_tokens` is `max_tokens`, `json_schema` is `response_format`... An
/// OpenAI request sets a grammar only through its tools ([`OpenAiRequest::tool_use`]), so a
/// grammar that does not compile (a function's schema that llguidance refuses) is `tools`.
pub fn field_name(engine_field: &str) -> &str {
    match engine_field {
        "max_new_tokens" => "max_tokens",
        "min_new_tokens" => "min_tokens",
        "top_logprobs_num" => "top_logprobs",
        "text" | "input_ids" => "prompt",
        "json_schema" | "regex" => "response_format",
        "grammar" => "tools",
        other => other,
    }
}

/// `logit_bias` keyed by token id.
fn token_id_bias(bias: &HashMap<String, f32>) -> Result<BTreeMap<u32, f32>> {
    bias.iter()
        .map(|(token, &bias)| {
            let id = token.parse::<u32>().map_err(|_| Error::InvalidParameter {
                field: "logit_bias",
                reason: format!("keys are token ids; '{token}' is not one"),
            })?;
            Ok((id, bias))
        })
        .collect()
}

/// Which endpoint an answer is for, which names its objects and shapes its choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: `messages` through the chat template; choices carry a message.
    Chat,
    /// `/v1/completions`: `prompt` continued; choices carry a text.
    Completion,
}

/// OpenAI's name for why a choice ended.
pub fn finish_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop { .. } => "stop",
        FinishReason::Length { .. } => "length",
        FinishReason::Abort => "abort",
    }
}

/// Token counts of a request, as OpenAI's `usage` reports them.
#[derive(Debug, Default)]
pub struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

impl Usage {
    /// Counts a sequence's last output (a prompt's tokens once, whatever its `n`).
    pub fn add(&mut self, output: &GenerateOutput, n: usize) {
        if output.index.is_multiple_of(n.max(1)) {
            self.prompt_tokens += output.meta_info.prompt_tokens;
            self.cached_tokens += output.meta_info.cached_tokens;
        }
        self.completion_tokens += output.meta_info.completion_tokens;
    }

    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        })
    }
}

/// Builds the objects of one request's answer: whole responses and stream chunks. Choices carry
/// the logprobs their caller renders (null when none were asked for).
#[derive(Debug)]
pub struct Responder {
    /// The endpoint answered.
    pub endpoint: Endpoint,
    /// The answer's `id`, the same in every chunk.
    pub id: String,
    /// When the answer started, in Unix seconds.
    pub created: u64,
    /// The model's name.
    pub model: String,
    /// How to read tool calls out of chat outputs, when the request's tools may be called.
    pub tool_format: Option<ToolCallFormat>,
}

/// What a streamed choice has said so far, which shapes its next chunks.
#[derive(Debug)]
pub struct ChoiceStream {
    /// Whether its first chunk (which carries chat's `role`) was made.
    started: bool,
    /// Its tool calls, read as they come.
    parser: Option<ToolCallParser>,
}

impl Responder {
    /// The whole response of a non-streamed request, from its outputs in index order, each
    /// choice with `logprobs(output)`.
    pub fn response(
        &self,
        outputs: &[GenerateOutput],
        usage: &Usage,
        logprobs: impl Fn(&GenerateOutput) -> Value,
    ) -> Value {
        let choices: Vec<Value> = outputs
            .iter()
            .map(|output| {
                let finish = output.meta_info.finish_reason.as_ref().map(finish_reason);
                let logprobs = logprobs(output);
                match (self.endpoint, self.tool_format) {
                    (Endpoint::Chat, None) => json!({
                        "index": output.index,
                        "message": { "role": "assistant", "content": output.text },
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }),
                    (Endpoint::Chat, Some(format)) => {
                        let reply = format.parse(&output.text);
                        let mut message = json!({ "role": "assistant", "content": reply.content });
                        if !reply.calls.is_empty() {
                            if reply.content.is_empty() {
                                message["content"] = Value::Null;
                            }
                            message["tool_calls"] = reply
                                .calls
                                .iter()
                                .enumerate()
                                .map(|(index, call)| {
                                    json!({
                                        "id": self.call_id(output.index, index),
                                        "type": "function",
                                        "function": { "name": call.name, "arguments": call.arguments },
                                    })
                                })
                                .collect();
                        }
                        let finish = self.finish_reason(output, !reply.calls.is_empty());
                        json!({ "index": output.index, "message": message, "logprobs": logprobs, "finish_reason": finish })
                    }
                    (Endpoint::Completion, _) => json!({
                        "index": output.index,
                        "text": output.text,
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }),
                }
            })
            .collect();
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completion => "text_completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage.json(),
        })
    }

    /// The state of a new streamed choice, for [`Self::chunk`].
    pub fn choice_stream(&self) -> ChoiceStream {
        let parser = match self.endpoint {
            Endpoint::Chat => self.tool_format.map(ToolCallFormat::parser),
            Endpoint::Completion => None,
        };
        ChoiceStream { started: false, parser }
    }

    /// The chunk of a streamed response for a choice's next output, `choice` what the choice
    /// said before: its new text (for chat, the assistant's role too on the choice's first
    /// chunk, and the calls read so far as `tool_calls` deltas), its `logprobs`, its finish
    /// reason when it ends. `None` when the output says nothing yet (text that may start a
    /// call is held back until it is known).
    pub fn chunk(
        &self,
        choice: &mut ChoiceStream,
        output: &GenerateOutput,
        logprobs: Value,
    ) -> Option<Value> {
        let finish = output.meta_info.finish_reason.as_ref().map(finish_reason);
        let first = !std::mem::replace(&mut choice.started, true);
        let choice = match (self.endpoint, &mut choice.parser) {
            (Endpoint::Chat, None) => {
                let delta = if first {
                    json!({ "role": "assistant", "content": output.text })
                } else {
                    json!({ "content": output.text })
                };
                json!({ "index": output.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
            (Endpoint::Chat, Some(parser)) => {
                let mut events = parser.push(&output.text);
                if finish.is_some() {
                    events.extend(parser.finish());
                }
                let delta = self.tool_delta(output.index, first, events);
                if delta.is_empty() && finish.is_none() && logprobs.is_null() {
                    return None;
                }
                let finish = self.finish_reason(output, parser.has_calls());
                json!({ "index": output.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
            (Endpoint::Completion, _) => {
                json!({ "index": output.index, "text": output.text, "logprobs": logprobs, "finish_reason": finish })
            }
        };
        Some(self.chunk_with(vec![choice], None))
    }

    /// The delta of chat choice `choice` that says `events`: its text as `content`, its calls
    /// as `tool_calls` (one entry per call: the first with the call's `id`, `type` and name,
    /// each with the new fragment of its arguments).
    fn tool_delta(&self, choice: usize, first: bool, events: Vec<ToolCallEvent>) -> Map<String, Value> {
        let mut delta = Map::new();
        if first {
            delta.insert("role".into(), "assistant".into());
        }
        let mut content = String::new();
        let mut calls: Vec<Value> = Vec::new();
        for event in events {
            match event {
                ToolCallEvent::Content(text) => content.push_str(&text),
                ToolCallEvent::Call { index, name } => calls.push(json!({
                    "index": index,
                    "id": self.call_id(choice, index),
                    "type": "function",
                    "function": { "name": name, "arguments": "" },
                })),
                ToolCallEvent::Arguments { index, fragment } => match calls.last_mut() {
                    Some(call) if call["index"] == index => {
                        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
                        call["function"]["arguments"] = format!("{arguments}{fragment}").into();
                    }
                    _ => calls.push(json!({ "index": index, "function": { "arguments": fragment } })),
                },
            }
        }
        if !content.is_empty() {
            delta.insert("content".into(), content.into());
        }
        if !calls.is_empty() {
            delta.insert("tool_calls".into(), calls.into());
        }
        delta
    }

    /// The id of the `index`-th call of choice `choice`, unique to the answer.
    fn call_id(&self, choice: usize, index: usize) -> String {
        let answer = self.id.split_once('-').map_or(self.id.as_str(), |(_, answer)| answer);
        format!("call_{answer}_{choice}_{index}")
    }

    /// A chat output's finish reason: `tool_calls` when it stopped after calls.
    fn finish_reason(&self, output: &GenerateOutput, called: bool) -> Option<&'static str> {
        match &output.meta_info.finish_reason {
            Some(FinishReason::Stop { .. }) if called => Some("tool_calls"),
            reason => reason.as_ref().map(finish_reason),
        }
    }

    /// The last chunk of a stream that asked for `stream_options.include_usage`: no choices.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        self.chunk_with(Vec::new(), Some(usage.json()))
    }

    fn chunk_with(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{MetaInfo, StopMatch};

    fn parse(body: &str) -> serde_json::Result<OpenAiRequest> {
        serde_json::from_str(body)
    }

    /// The error of a body that does not parse.
    fn refusal(body: &str) -> String {
        parse(body).err().unwrap_or_else(|| panic!("{body} parsed")).to_string()
    }

    fn chat(content: &str) -> String {
        format!(r#"{{"messages": [{{"role": "user", "content": {content}}}]}}"#)
    }

    #[test]
    fn content_is_a_text_or_text_parts_joined_by_newlines() {
        let parts =
            parse(&chat(r#"[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]"#)).unwrap();
        assert_eq!(parts.chat_messages().unwrap(), vec![ChatMessage::new("user", "a\nb")]);
        let text = parse(&chat(r#""Hi""#)).unwrap();
        assert_eq!(text.chat_messages().unwrap(), vec![ChatMessage::new("user", "Hi")]);
        let none = parse(r#"{"messages": [{"role": "developer", "content": null, "name": "ops"}]}"#).unwrap();
        assert_eq!(none.chat_messages().unwrap(), vec![ChatMessage::new("system", "")]);
        assert_eq!(parse("{}").unwrap().chat_messages(), None);
    }

    #[test]
    fn content_other_than_text_is_refused() {
        for content in [
            r#"[{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]"#,
            r#"[{"type": "text", "text": "a", "cache_control": {}}]"#,
            r#"[{"text": "a"}]"#,
            "5",
        ] {
            let error = refusal(&chat(content));
            assert!(
                error.contains("did not match any variant of untagged enum Content"),
                "{content}: {error}"
            );
        }
        let error = refusal(r#"{"messages": [{"role": "user", "content": "Hi", "function_call": {}}]}"#);
        assert!(error.starts_with("unknown field `function_call`"), "{error}");
        let error = refusal(r#"{"messages": [{"content": "Hi"}]}"#);
        assert!(error.starts_with("missing field `role`"), "{error}");
    }

    fn schema_of(response_format: &str) -> serde_json::Result<Option<Value>> {
        let body = format!(r#"{{"messages": [], "response_format": {response_format}}}"#);
        Ok(parse(&body)?.sampling_params(1).unwrap().json_schema)
    }

    #[test]
    fn response_format_json_schema_is_the_output_schema() {
        let schema = schema_of(
            r#"{"type": "json_schema", "json_schema": {"name": "answer", "description": "yes or no",
                "schema": {"type": "string", "enum": ["yes", "no"]}, "strict": true}}"#,
        );
        assert_eq!(schema.unwrap(), Some(json!({"type": "string", "enum": ["yes", "no"]})));
        let any = schema_of(r#"{"type": "json_schema", "json_schema": {"name": "anything"}}"#);
        assert_eq!(any.unwrap(), Some(json!({})));
        assert_eq!(schema_of(r#"{"type": "json_object"}"#).unwrap(), Some(json!({"type": "object"})));
        assert_eq!(schema_of(r#"{"type": "text"}"#).unwrap(), None);
    }

    #[test]
    fn a_malformed_response_format_is_refused() {
        let error = |format: &str| schema_of(format).unwrap_err().to_string();
        assert!(
            error(r#"{"type": "json_schema", "json_schema": {"schema": {}}}"#)
                .starts_with("missing field `name`")
        );
        assert!(error(r#"{"type": "json_schema"}"#).starts_with("missing field `json_schema`"));
        let extra =
            error(r#"{"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "format": 1}}"#);
        assert!(extra.starts_with("unknown field `format`"), "{extra}");
        // serde's internally tagged unit variants ignore other fields, `deny_unknown_fields` or not.
        assert_eq!(schema_of(r#"{"type": "text", "strict": true}"#).unwrap(), None);
        assert!(error(r#"{"type": "xml"}"#).starts_with("unknown variant `xml`"));
        assert!(error(r#""json""#).contains("expected internally tagged enum ResponseFormat"));
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let error = refusal(r#"{"messages": [], "temprature": 1}"#);
        assert!(
            error.starts_with("unknown field `temprature`, expected one of `model`, `messages`"),
            "{error}"
        );
        let error = refusal(r#"{"stream": true, "stream_options": {"include_obfuscation": false}}"#);
        assert!(error.starts_with("unknown field `include_obfuscation`"), "{error}");
        let error = refusal(r#"{"temperature": 1, "temperature": 2}"#);
        assert!(error.starts_with("duplicate field `temperature`"), "{error}");
    }

    #[test]
    fn the_sampling_fields_become_sampling_params() {
        let request = parse(
            r#"{"prompt": "x", "stop": "\n", "seed": -1, "n": 2, "logit_bias": {"12": 5, "7": -100},
                "min_tokens": 2, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": true,
                "frequency_penalty": 0.5, "presence_penalty": 0.25, "top_p": 0.9, "temperature": 0}"#,
        )
        .unwrap();
        let sampling = request.sampling_params(9).unwrap();
        let expected = SamplingParams {
            max_new_tokens: 9,
            min_new_tokens: 2,
            temperature: 0.0,
            top_p: 0.9,
            top_k: 5,
            min_p: 0.1,
            repetition_penalty: 1.1,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            stop: vec!["\n".into()],
            ignore_eos: true,
            seed: Some(u64::MAX),
            n: 2,
            logit_bias: BTreeMap::from([(7, -100.0), (12, 5.0)]),
            ..SamplingParams::default()
        };
        assert_eq!(sampling, expected);
        let stops = parse(r#"{"stop": ["a", "b"]}"#).unwrap().sampling_params(1).unwrap().stop;
        assert_eq!(stops, vec!["a".to_string(), "b".to_string()]);
        let defaults = parse("{}").unwrap().sampling_params(128).unwrap();
        assert_eq!(defaults, SamplingParams::default());
    }

    #[test]
    fn a_logit_bias_key_that_is_not_a_token_id_is_named() {
        let request = parse(r#"{"logit_bias": {"hello": 1}}"#).unwrap();
        let error = request.sampling_params(1).unwrap_err();
        let Error::InvalidParameter { field, reason } = error else { panic!("{error}") };
        assert_eq!((field, reason.as_str()), ("logit_bias", "keys are token ids; 'hello' is not one"));
    }

    #[test]
    fn max_completion_tokens_wins_and_a_chat_defaults_to_the_context_left() {
        let both = parse(r#"{"max_tokens": 5, "max_completion_tokens": 7}"#).unwrap();
        assert_eq!(both.max_new_tokens(), Some(7));
        assert_eq!(both.chat_max_new_tokens(3, 100), 7);
        let neither = parse("{}").unwrap();
        assert_eq!(neither.max_new_tokens(), None);
        assert_eq!(neither.chat_max_new_tokens(3, 100), 97);
        assert_eq!(neither.chat_max_new_tokens(100, 100), 1);
        assert!(!neither.streams() && !neither.include_usage() && neither.samples() == 1);
    }

    fn output(index: usize, text: &str, finish_reason: Option<FinishReason>) -> GenerateOutput {
        GenerateOutput {
            index,
            text: text.into(),
            output_ids: vec![1],
            meta_info: MetaInfo {
                id: "r".into(),
                prompt_tokens: 10,
                completion_tokens: 3,
                cached_tokens: 4,
                finish_reason,
                e2e_latency: 0.5,
                output_logprobs: None,
                input_logprobs: None,
            },
        }
    }

    #[test]
    fn a_chat_answer_counts_each_prompt_once() {
        let responder = Responder {
            endpoint: Endpoint::Chat,
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            tool_format: None,
        };
        let stop = FinishReason::Stop { matched: StopMatch::Token(2) };
        let outputs =
            [output(0, "yes", Some(stop.clone())), output(1, "no", Some(FinishReason::Length { length: 3 }))];
        let mut usage = Usage::default();
        for output in &outputs {
            usage.add(output, 2);
        }
        let response = responder.response(&outputs, &usage, |_| Value::Null);
        assert_eq!(response["object"], "chat.completion");
        assert_eq!(response["choices"][0]["message"], json!({"role": "assistant", "content": "yes"}));
        assert_eq!(response["choices"][1]["finish_reason"], "length");
        let expected_usage = json!({"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16,
                                    "prompt_tokens_details": {"cached_tokens": 4}});
        assert_eq!(response["usage"], expected_usage);

        let mut choice = responder.choice_stream();
        let first = responder.chunk(&mut choice, &output(0, "y", None), Value::Null).unwrap();
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["choices"][0]["delta"], json!({"role": "assistant", "content": "y"}));
        assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
        let last = responder.chunk(&mut choice, &output(0, "es", Some(stop)), Value::Null).unwrap();
        assert_eq!(last["choices"][0]["delta"], json!({"content": "es"}));
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        let usage_chunk = responder.usage_chunk(&usage);
        assert_eq!((&usage_chunk["choices"], &usage_chunk["usage"]), (&json!([]), &expected_usage));
    }

    /// A tokenizer for grammars: ChatML's end of turn, then bytes.
    fn tokenizer() -> crate::tokenizer::Tokenizer {
        crate::tokenizer::testing::byte_level(&["<unk>", "<|im_end|>"], &[], None, 1)
    }

    const WEATHER: &str = r#"{"type": "function", "function": {"name": "weather", "description": "Now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}"#;

    #[test]
    fn tools_history_and_tool_choice_are_read() {
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "Paris?"}},
                {{"role": "assistant", "content": null, "tool_calls": [{{"id": "c1", "type": "function",
                  "function": {{"name": "weather", "arguments": "{{\"city\": \"Paris\"}}"}}}}]}},
                {{"role": "tool", "tool_call_id": "c1", "content": "sunny"}}],
              "tools": [{WEATHER}], "tool_choice": "required", "parallel_tool_calls": false,
              "store": false, "metadata": {{"a": "b"}}, "service_tier": "auto"}}"#
        );
        let request = parse(&body).unwrap();
        let messages = request.chat_messages().unwrap();
        assert_eq!(messages[1].tool_calls[0].arguments, r#"{"city": "Paris"}"#);
        assert_eq!(messages[1].content, "");
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
        let tokenizer = tokenizer();
        let tool_use = request.tool_use(Some(ToolCallFormat::Hermes), &tokenizer).unwrap();
        assert_eq!(tool_use.format, Some(ToolCallFormat::Hermes));
        assert_eq!(tool_use.tools[0]["function"]["description"], "Now");
        let grammar = tool_use.grammar.unwrap();
        assert!(grammar.starts_with("start: \"<tool_call>\" calls") && !grammar.contains(")*"), "{grammar}");

        let named = format!(
            r#"{{"tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "weather"}}}}}}"#
        );
        assert!(
            parse(&named)
                .unwrap()
                .tool_use(Some(ToolCallFormat::Hermes), &tokenizer)
                .unwrap()
                .grammar
                .is_some()
        );
        let none = format!(r#"{{"tools": [{WEATHER}], "tool_choice": "none"}}"#);
        let none = parse(&none).unwrap().tool_use(None, &tokenizer).unwrap();
        assert_eq!((none.grammar, none.format, none.tools.len()), (None, None, 1));
        let nothing = parse("{}").unwrap().tool_use(None, &tokenizer).unwrap();
        assert!(nothing.tools.is_empty() && nothing.grammar.is_none() && nothing.format.is_none());
    }

    #[test]
    fn tool_errors_name_their_field() {
        let tokenizer = tokenizer();
        let error = |body: String, format: Option<ToolCallFormat>| {
            let Error::InvalidParameter { field, reason } =
                parse(&body).unwrap().tool_use(format, &tokenizer).unwrap_err()
            else {
                panic!()
            };
            format!("{field}: {reason}")
        };
        let hermes = Some(ToolCallFormat::Hermes);
        assert!(
            error(format!(r#"{{"tools": [{WEATHER}]}}"#), None)
                .starts_with("tools: this model's chat template")
        );
        assert!(
            error(format!(r#"{{"tools": [{WEATHER}, {WEATHER}]}}"#), hermes).contains("'weather' is not one")
        );
        let other = format!(
            r#"{{"tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "x"}}}}}}"#
        );
        assert_eq!(error(other, hermes), "tool_choice: it names 'x', which 'tools' does not offer");
        assert!(
            error(format!(r#"{{"tools": [{WEATHER}], "tool_choice": "always"}}"#), hermes)
                .starts_with("tool_choice: 'always'")
        );
        assert!(
            error(r#"{"tool_choice": "required"}"#.into(), hermes).starts_with("tool_choice: calls need")
        );
        let json = format!(r#"{{"tools": [{WEATHER}], "response_format": {{"type": "json_object"}}}}"#);
        assert!(error(json, hermes).starts_with("response_format: "));
        let bad_schema = r#"{"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}"#;
        assert!(error(bad_schema.into(), hermes).contains("not a JSON Schema object"));
        assert!(
            refusal(r#"{"tools": [{"type": "retrieval", "function": {"name": "f"}}]}"#)
                .contains("unknown variant")
        );
        // A schema llguidance refuses fails in the engine, as the tools' grammar.
        assert_eq!(field_name("grammar"), "tools");
    }

    #[test]
    fn calls_are_answered_whole_and_streamed_alike() {
        let responder = Responder {
            endpoint: Endpoint::Chat,
            id: "chatcmpl-9-4".into(),
            created: 7,
            model: "m".into(),
            tool_format: Some(ToolCallFormat::Hermes),
        };
        let text = "Looking.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let stop = FinishReason::Stop { matched: StopMatch::Token(2) };
        let whole =
            responder.response(&[output(0, text, Some(stop.clone()))], &Usage::default(), |_| Value::Null);
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], "Looking.\n");
        let expected_call = json!({"id": "call_9-4_0_0", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}});
        assert_eq!(choice["message"]["tool_calls"], json!([expected_call]));

        // Streamed four bytes at a time, the deltas rebuild the same message.
        let mut stream = responder.choice_stream();
        let (mut content, mut name, mut arguments, mut id) =
            (String::new(), String::new(), String::new(), None);
        let mut finish = Value::Null;
        let pieces: Vec<&str> =
            text.as_bytes().chunks(4).map(|piece| std::str::from_utf8(piece).unwrap()).collect();
        for (at, piece) in pieces.iter().enumerate() {
            let last = at + 1 == pieces.len();
            let output = output(0, piece, last.then(|| stop.clone()));
            let Some(chunk) = responder.chunk(&mut stream, &output, Value::Null) else { continue };
            let delta = &chunk["choices"][0]["delta"];
            content.push_str(delta["content"].as_str().unwrap_or_default());
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(call["index"], 0);
                if let Some(call_id) = call["id"].as_str() {
                    assert!(id.replace(call_id.to_string()).is_none(), "one id");
                    name.push_str(call["function"]["name"].as_str().unwrap());
                }
                arguments.push_str(call["function"]["arguments"].as_str().unwrap());
            }
            finish = chunk["choices"][0]["finish_reason"].clone();
        }
        assert_eq!(
            (content.as_str(), name.as_str(), finish.as_str()),
            ("Looking.\n", "weather", Some("tool_calls"))
        );
        assert_eq!(
            (id.unwrap(), arguments),
            ("call_9-4_0_0".to_string(), "{\"city\": \"Paris\"}".to_string())
        );

        // Text alone is content, and a length cut is `length` even after a call.
        let plain = responder.response(&[output(0, "Hi", Some(stop))], &Usage::default(), |_| Value::Null);
        assert_eq!(plain["choices"][0]["message"], json!({"role": "assistant", "content": "Hi"}));
        let cut = responder.response(
            &[output(0, text, Some(FinishReason::Length { length: 3 }))],
            &Usage::default(),
            |_| Value::Null,
        );
        assert_eq!(cut["choices"][0]["finish_reason"], "length");
    }
}
