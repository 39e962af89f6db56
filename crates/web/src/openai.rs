//! `engine.chat.completions.create(...)`: OpenAI's chat request body mapped onto the engine's
//! request contract, and its response objects and stream chunks built from the engine's
//! outputs, in the same shapes as `flint serve`'s `/v1/chat/completions` (see
//! `crates/native/src/cli/serve/openai.rs`). `signal` is the JS wrapper's and never gets here;
//! `logprobs` is not supported in the browser yet, and like any unknown field is an error.

use std::collections::{BTreeMap, HashMap};

use flint_core::chat::ChatMessage;
use flint_core::engine::{FinishReason, GenerateOutput, GenerateRequest, Prompts};
use flint_core::sample::SamplingParams;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The body of a chat completion request. Unknown fields are rejected, so a parameter flint
/// does not implement is never silently ignored. `top_k`, `min_p`, `repetition_penalty`,
/// `min_tokens` and `ignore_eos` are extensions (as vLLM has them).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChatRequest {
    /// The model's name, for the caller's bookkeeping: echoed, since one engine serves one model.
    model: Option<String>,
    messages: Vec<WireMessage>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<usize>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    stop: Option<OneOrMany<String>>,
    seed: Option<i64>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    logit_bias: Option<HashMap<String, f32>>,
    response_format: Option<ResponseFormat>,
    /// An end-user id, for the caller's own bookkeeping: accepted and ignored.
    #[serde(rename = "user")]
    _user: Option<String>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    min_tokens: Option<usize>,
    ignore_eos: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// `response_format`: free text, any JSON object, or JSON valid against a schema.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSchemaFormat {
    #[serde(rename = "name")]
    _name: String,
    #[serde(rename = "description")]
    _description: Option<String>,
    schema: Option<Value>,
    #[serde(rename = "strict")]
    _strict: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireMessage {
    role: String,
    content: Option<Content>,
    #[serde(rename = "name")]
    _name: Option<String>,
}

/// A message's content: a text, or parts of which flint takes text only.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ContentPart {
    Text { text: String },
}

/// A chat request made ready for the engine, and how to answer it.
pub(crate) struct ChatPlan {
    pub request: GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// The `model` of the response objects.
    pub model: Option<String>,
}

impl ChatRequest {
    /// The engine request of this chat, its prompt made by `encode_chat`. `max_sequence_tokens`
    /// bounds the default `max_tokens` (as many as the context has left, as OpenAI does).
    pub(crate) fn plan(
        self,
        encode_chat: impl FnOnce(&[ChatMessage]) -> Result<Vec<u32>>,
        max_sequence_tokens: usize,
        rid: String,
    ) -> Result<ChatPlan> {
        let messages: Vec<ChatMessage> = self.messages.iter().map(chat_message).collect();
        if messages.is_empty() {
            return Err(Error::invalid("messages", "at least one message is needed"));
        }
        let ids = encode_chat(&messages)?;
        let max_new_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or_else(|| max_sequence_tokens.saturating_sub(ids.len()).max(1));
        let defaults = SamplingParams::default();
        let sampling = SamplingParams {
            max_new_tokens,
            min_new_tokens: self.min_tokens.unwrap_or(defaults.min_new_tokens),
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(defaults.repetition_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(defaults.presence_penalty),
            stop: match self.stop {
                None => Vec::new(),
                Some(OneOrMany::One(stop)) => vec![stop],
                Some(OneOrMany::Many(stops)) => stops,
            },
            ignore_eos: self.ignore_eos.unwrap_or(false),
            // A seed is 64 bits either way; negative ones are as good as positive ones.
            seed: self.seed.map(|seed| seed as u64),
            n: self.n.unwrap_or(1),
            logit_bias: logit_bias(self.logit_bias.unwrap_or_default())?,
            json_schema: self.response_format.and_then(ResponseFormat::json_schema),
            ..defaults
        };
        let stream = self.stream.unwrap_or(false);
        Ok(ChatPlan {
            request: GenerateRequest {
                input_ids: Some(Prompts::One(ids)),
                sampling,
                stream,
                rid: Some(rid),
                ..GenerateRequest::default()
            },
            stream,
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            model: self.model,
        })
    }
}

impl ResponseFormat {
    /// The JSON Schema the output must follow, if any.
    fn json_schema(self) -> Option<Value> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(json!({"type": "object"})),
            ResponseFormat::JsonSchema { json_schema } => {
                Some(json_schema.schema.unwrap_or_else(|| json!({})))
            }
        }
    }
}

fn chat_message(message: &WireMessage) -> ChatMessage {
    let content = match &message.content {
        None => String::new(),
        Some(Content::Text(text)) => text.clone(),
        Some(Content::Parts(parts)) => {
            parts.iter().map(|ContentPart::Text { text }| text.as_str()).collect::<Vec<_>>().join("\n")
        }
    };
    // OpenAI's newer name for the system role; chat templates know `system`.
    let role = if message.role == "developer" { "system" } else { message.role.as_str() };
    ChatMessage::new(role, content)
}

fn logit_bias(bias: HashMap<String, f32>) -> Result<BTreeMap<u32, f32>> {
    bias.into_iter()
        .map(|(token, bias)| {
            let id = token.parse::<u32>().map_err(|_| {
                Error::invalid("logit_bias", format!("keys are token ids; '{token}' is not one"))
            })?;
            Ok((id, bias))
        })
        .collect()
}

/// OpenAI's name for why a choice ended.
fn finish_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop { .. } => "stop",
        FinishReason::Length { .. } => "length",
        FinishReason::Abort => "abort",
    }
}

/// Token counts of a request, as OpenAI's `usage` reports them.
#[derive(Default)]
pub(crate) struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

impl Usage {
    /// Counts a sequence's last output (a prompt's tokens once, whatever its `n`).
    pub(crate) fn add(&mut self, output: &GenerateOutput, n: usize) {
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

/// Builds the objects of one request's answer: whole responses and stream chunks.
pub(crate) struct Responder {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Responder {
    /// The whole response of a non-streamed request, from its outputs in index order.
    pub(crate) fn response(&self, outputs: &[GenerateOutput], usage: &Usage) -> Value {
        let choices: Vec<Value> = outputs
            .iter()
            .map(|output| {
                json!({
                    "index": output.index,
                    "message": { "role": "assistant", "content": output.text },
                    "logprobs": Value::Null,
                    "finish_reason": output.meta_info.finish_reason.as_ref().map(finish_reason),
                })
            })
            .collect();
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage.json(),
        })
    }

    /// One chunk of a streamed response, with one choice: its new text (with the assistant's
    /// role on the first delta of each choice), its finish reason when it ends.
    pub(crate) fn chunk(&self, output: &GenerateOutput, role: bool) -> Value {
        let delta = if role {
            json!({ "role": "assistant", "content": output.text })
        } else {
            json!({ "content": output.text })
        };
        let choice = json!({
            "index": output.index,
            "delta": delta,
            "logprobs": Value::Null,
            "finish_reason": output.meta_info.finish_reason.as_ref().map(finish_reason),
        });
        self.chunk_with(vec![choice], None)
    }

    /// The last chunk of a stream that asked for `stream_options.include_usage`: no choices.
    pub(crate) fn usage_chunk(&self, usage: &Usage) -> Value {
        self.chunk_with(Vec::new(), Some(usage.json()))
    }

    fn chunk_with(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
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

    fn parse(body: &str) -> Result<ChatRequest> {
        crate::error::from_json(body, "request")
    }

    #[test]
    fn a_chat_request_becomes_an_engine_request() {
        let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 4,
                       "stop": "\n", "seed": -1, "stream": true, "stream_options": {"include_usage": true}}"#;
        let plan = parse(body)
            .unwrap()
            .plan(|messages| Ok(vec![messages.len() as u32, 7]), 100, "chatcmpl-1".into())
            .unwrap();
        assert_eq!(plan.request.input_ids, Some(Prompts::One(vec![1, 7])));
        assert_eq!(plan.request.sampling.max_new_tokens, 4);
        assert_eq!(plan.request.sampling.stop, vec!["\n".to_string()]);
        assert_eq!(plan.request.sampling.seed, Some(u64::MAX));
        assert!(plan.stream && plan.include_usage && plan.request.stream);
    }

    #[test]
    fn max_tokens_defaults_to_the_context_left() {
        let body = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}"#;
        let plan = parse(body).unwrap().plan(|_| Ok(vec![1, 2, 3]), 100, "id".into()).unwrap();
        assert_eq!(plan.request.sampling.max_new_tokens, 97);
    }

    #[test]
    fn unknown_and_mistyped_fields_are_named() {
        let unknown = parse(r#"{"messages": [], "logprobs": true}"#).err().unwrap().to_string();
        assert!(unknown.contains("logprobs"), "{unknown}");
        let mistyped = parse(r#"{"messages": [], "temperature": "hot"}"#).err().unwrap().to_string();
        assert!(mistyped.contains("'temperature'"), "{mistyped}");
        let empty = parse(r#"{"messages": []}"#).unwrap().plan(|_| Ok(vec![1]), 10, "id".into());
        assert!(empty.err().unwrap().to_string().contains("'messages'"));
    }
}
