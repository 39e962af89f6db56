//! OpenAI's request bodies, mapped onto the engine's request contract, and its response
//! objects and stream chunks, built from the engine's outputs.

use std::collections::HashMap;

use flint_native::{
    ChatMessage, FinishReason, GenerateOutput, GenerateRequest, LLM, Prompts, SamplingParams,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::api_error::ApiError;

/// Which endpoint a request came to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: `messages` through the chat template.
    Chat,
    /// `/v1/completions`: `prompt` continued.
    Completion,
}

/// The body of either endpoint: the fields of both, each checked against the endpoint it came
/// to. Unknown fields are rejected, so a parameter flint does not implement is never silently
/// ignored. `top_k`, `min_p`, `repetition_penalty`, `min_tokens` and `ignore_eos` are
/// extensions (as vLLM has them). `response_format` constrains the output to JSON (any object,
/// or valid against a JSON Schema) as OpenAI's structured outputs do; flint enforces a schema
/// whether or not `strict` is set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiRequest {
    model: Option<String>,
    messages: Option<Vec<WireMessage>>,
    prompt: Option<PromptInput>,
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
    logprobs: Option<Value>,
    top_logprobs: Option<usize>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<usize>,
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
    /// The schema's name, for the caller's own bookkeeping: required as OpenAI requires it.
    #[serde(rename = "name")]
    _name: String,
    /// What the format is for, which OpenAI shows the model: accepted and ignored.
    #[serde(rename = "description")]
    _description: Option<String>,
    /// The schema; without one, any JSON value.
    schema: Option<Value>,
    /// OpenAI's strict mode: flint always enforces the schema exactly.
    #[serde(rename = "strict")]
    _strict: Option<bool>,
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

/// `prompt`: a text, texts, token ids, or lists of token ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireMessage {
    role: String,
    content: Option<Content>,
    /// A participant's name: accepted and ignored (chat templates have no place for it).
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

/// Parses a request body of either endpoint; a malformed one (not JSON, invalid UTF-8, a field
/// of the wrong type, an unknown field) is a 400 that says where.
pub fn parse_request(body: &[u8]) -> Result<OpenAiRequest, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let request = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ApiError::invalid(format!("the request body is not a valid request: {inner}"), None)
        } else {
            ApiError::invalid(format!("invalid '{path}': {inner}"), Some(&path))
        }
    })?;
    deserializer.end().map_err(|e| {
        ApiError::invalid(format!("the request body has more after its JSON object: {e}"), None)
    })?;
    Ok(request)
}

/// What [`OpenAiRequest::plan`] needs of the served model: its chat prompts and its context.
pub trait ServedModel {
    /// A conversation as prompt tokens, through the model's chat template.
    fn encode_chat(&self, messages: &[ChatMessage]) -> flint_native::Result<Vec<u32>>;

    /// The most tokens one sequence may hold, prompt and generated together.
    fn max_sequence_tokens(&self) -> usize;
}

impl ServedModel for LLM {
    fn encode_chat(&self, messages: &[ChatMessage]) -> flint_native::Result<Vec<u32>> {
        LLM::encode_chat(self, messages)
    }

    fn max_sequence_tokens(&self) -> usize {
        LLM::max_sequence_tokens(self)
    }
}

/// What a request asks for beyond the engine request: how to answer it.
pub struct Plan {
    pub request: GenerateRequest,
    /// Outputs the engine gives: prompts × n.
    pub outputs: usize,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
}

impl OpenAiRequest {
    /// Checks the request against the endpoint and the served model, and makes it an engine
    /// request.
    pub fn plan(
        self,
        endpoint: Endpoint,
        model_id: &str,
        served: &impl ServedModel,
        rid: String,
    ) -> Result<Plan, ApiError> {
        if let Some(model) = &self.model
            && model != model_id
        {
            return Err(ApiError::invalid(
                format!("the model '{model}' does not exist: this server serves '{model_id}'"),
                Some("model"),
            )
            .with_code("model_not_found"));
        }
        let unsupported = |param: &str, what: &str| {
            Err(ApiError::invalid(format!("'{param}' {what} is not supported by flint"), Some(param)))
        };
        if self.echo == Some(true) {
            return unsupported("echo", "true");
        }
        if self.suffix.is_some() {
            return unsupported("suffix", "(insertion)");
        }
        let n = self.n.unwrap_or(1);
        let (return_logprob, top_logprobs_num) = self.logprobs(endpoint)?;
        if self.best_of.is_some_and(|best_of| best_of != n) {
            return unsupported("best_of", "other than n");
        }
        let (text, input_ids, prompts) = match endpoint {
            Endpoint::Chat => {
                if self.prompt.is_some() {
                    return Err(ApiError::invalid(
                        "chat completions take 'messages', not 'prompt'",
                        Some("prompt"),
                    ));
                }
                let messages = self
                    .messages
                    .as_deref()
                    .ok_or_else(|| ApiError::invalid("'messages' is required", Some("messages")))?;
                let ids = served.encode_chat(&chat_messages(messages)?)?;
                (None, Some(Prompts::One(ids)), 1)
            }
            Endpoint::Completion => {
                if self.messages.is_some() {
                    return Err(ApiError::invalid(
                        "completions take 'prompt', not 'messages'",
                        Some("messages"),
                    ));
                }
                match self.prompt {
                    Some(PromptInput::Text(text)) => (Some(Prompts::One(text)), None, 1),
                    Some(PromptInput::Texts(texts)) => {
                        let count = texts.len();
                        (Some(Prompts::Batch(texts)), None, count)
                    }
                    Some(PromptInput::Ids(ids)) => (None, Some(Prompts::One(ids)), 1),
                    Some(PromptInput::IdLists(lists)) => {
                        let count = lists.len();
                        (None, Some(Prompts::Batch(lists)), count)
                    }
                    None => return Err(ApiError::invalid("'prompt' is required", Some("prompt"))),
                }
            }
        };
        let max_new_tokens = match (self.max_completion_tokens.or(self.max_tokens), &input_ids) {
            (Some(max), _) => max,
            // OpenAI's defaults: 16 tokens for a completion; for a chat, as many as the context
            // has left (the engine ends the turn at the template's end-of-turn token first).
            (None, Some(Prompts::One(ids))) if endpoint == Endpoint::Chat => {
                served.max_sequence_tokens().saturating_sub(ids.len()).max(1)
            }
            (None, _) => 16,
        };
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
            n,
            logit_bias: logit_bias(self.logit_bias.unwrap_or_default())?,
            json_schema: self.response_format.and_then(ResponseFormat::json_schema),
            ..defaults
        };
        Ok(Plan {
            request: GenerateRequest {
                text,
                input_ids,
                sampling,
                stream: self.stream.unwrap_or(false),
                return_logprob,
                top_logprobs_num,
                logprob_start_len: None,
                rid: Some(rid),
            },
            // Saturating: `n` is checked by the engine, which refuses more than a few.
            outputs: prompts.saturating_mul(n),
            n,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        })
    }

    /// `logprobs` (and `top_logprobs`) as (return logprobs, alternatives per token): a boolean
    /// for chat, the number of alternatives for completions.
    fn logprobs(&self, endpoint: Endpoint) -> Result<(bool, usize), ApiError> {
        const MOST: usize = 20;
        let (wanted, top) = match (endpoint, &self.logprobs) {
            (_, None | Some(Value::Null)) => (false, 0),
            (Endpoint::Chat, Some(Value::Bool(wanted))) => (*wanted, self.top_logprobs.unwrap_or(0)),
            (Endpoint::Completion, Some(Value::Number(top))) => {
                let top = top.as_u64().and_then(|t| usize::try_from(t).ok()).unwrap_or(usize::MAX);
                (true, top)
            }
            (Endpoint::Chat, _) => {
                return Err(ApiError::invalid("'logprobs' must be true or false", Some("logprobs")));
            }
            (Endpoint::Completion, _) => {
                return Err(ApiError::invalid(
                    format!("'logprobs' is the number of alternatives per token, 0 to {MOST}"),
                    Some("logprobs"),
                ));
            }
        };
        if self.top_logprobs.is_some() && !(endpoint == Endpoint::Chat && wanted) {
            return Err(ApiError::invalid("'top_logprobs' needs 'logprobs': true", Some("top_logprobs")));
        }
        if top > MOST {
            let param = if endpoint == Endpoint::Chat { "top_logprobs" } else { "logprobs" };
            return Err(ApiError::invalid(
                format!("{top} alternatives per token: at most {MOST}"),
                Some(param),
            ));
        }
        Ok((wanted, top))
    }
}

fn chat_messages(messages: &[WireMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    messages
        .iter()
        .map(|message| {
            let content = match &message.content {
                None => String::new(),
                Some(Content::Text(text)) => text.clone(),
                Some(Content::Parts(parts)) => parts
                    .iter()
                    .map(|ContentPart::Text { text }| text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            };
            // OpenAI's newer name for the system role; chat templates know `system`.
            let role = if message.role == "developer" { "system" } else { message.role.as_str() };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

fn logit_bias(bias: HashMap<String, f32>) -> Result<std::collections::BTreeMap<u32, f32>, ApiError> {
    bias.into_iter()
        .map(|(token, bias)| {
            let id = token.parse::<u32>().map_err(|_| {
                ApiError::invalid(
                    format!("logit_bias keys are token ids; '{token}' is not one"),
                    Some("logit_bias"),
                )
            })?;
            Ok((id, bias))
        })
        .collect()
}

/// OpenAI's name for why a choice ended.
pub fn finish_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop { .. } => "stop",
        FinishReason::Length { .. } => "length",
        FinishReason::Abort => "abort",
    }
}

/// Builds the objects of one request's answer: whole responses and stream chunks.
pub struct Responder<'a> {
    pub endpoint: Endpoint,
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
    pub llm: &'a LLM,
}

/// Token counts of a request, as OpenAI's `usage` reports them.
#[derive(Default)]
pub struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

impl Usage {
    /// Counts a sequence's last output (a prompt's tokens once, whatever its `n`).
    pub fn add(&mut self, output: &GenerateOutput, n: usize) {
        if output.index.is_multiple_of(n) {
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

impl Responder<'_> {
    /// The whole response of a non-streamed request, from its outputs in index order.
    pub fn response(&self, outputs: &[GenerateOutput], usage: &Usage) -> Value {
        let choices: Vec<Value> = outputs
            .iter()
            .map(|output| {
                let finish = output.meta_info.finish_reason.as_ref().map(finish_reason);
                let logprobs = self.logprobs(output, &mut 0);
                match self.endpoint {
                    Endpoint::Chat => json!({
                        "index": output.index,
                        "message": { "role": "assistant", "content": output.text },
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }),
                    Endpoint::Completion => json!({
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

    /// One chunk of a streamed response, with one choice: its new text (or, for chat, the
    /// assistant's role as the first delta), its logprobs, its finish reason when it ends.
    /// `text_offset` is where this chunk's text starts in the choice's whole text.
    pub fn chunk(&self, output: &GenerateOutput, role: bool, text_offset: &mut usize) -> Value {
        let finish = output.meta_info.finish_reason.as_ref().map(finish_reason);
        let logprobs = self.logprobs(output, text_offset);
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = if role {
                    json!({ "role": "assistant", "content": output.text })
                } else {
                    json!({ "content": output.text })
                };
                json!({ "index": output.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
            Endpoint::Completion => {
                json!({ "index": output.index, "text": output.text, "logprobs": logprobs, "finish_reason": finish })
            }
        };
        self.chunk_with(vec![choice], None)
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

    /// An output's token logprobs in the endpoint's shape, or null when none were asked for.
    fn logprobs(&self, output: &GenerateOutput, text_offset: &mut usize) -> Value {
        let Some(logprobs) = &output.meta_info.output_logprobs else { return Value::Null };
        let tokenizer = self.llm.tokenizer();
        let piece = |id: u32| tokenizer.decode(&[id], false).unwrap_or_default();
        match self.endpoint {
            Endpoint::Chat => {
                let entry = |id: u32, logprob: f64| {
                    let token = piece(id);
                    json!({ "token": token, "logprob": logprob, "bytes": token.as_bytes() })
                };
                let content: Vec<Value> = logprobs
                    .tokens
                    .iter()
                    .zip(&logprobs.top)
                    .map(|(chosen, top)| {
                        let mut item = entry(chosen.token_id, chosen.logprob);
                        item["top_logprobs"] = top.iter().map(|t| entry(t.token_id, t.logprob)).collect();
                        item
                    })
                    .collect();
                json!({ "content": content })
            }
            Endpoint::Completion => {
                let tokens: Vec<String> = logprobs.tokens.iter().map(|t| piece(t.token_id)).collect();
                let offsets: Vec<usize> = tokens
                    .iter()
                    .map(|token| {
                        let offset = *text_offset;
                        *text_offset += token.len();
                        offset
                    })
                    .collect();
                let top: Vec<Value> = logprobs
                    .top
                    .iter()
                    .map(|top| top.iter().map(|t| (piece(t.token_id), Value::from(t.logprob))).collect())
                    .collect();
                json!({
                    "tokens": tokens,
                    "token_logprobs": logprobs.tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    "top_logprobs": top,
                    "text_offset": offsets,
                })
            }
        }
    }
}
