//! OpenAI's request bodies, checked against the endpoint they came to and the served model and
//! made engine requests, and the logprobs of its answers. The shapes of requests and answers
//! are flint-core's ([`flint_core::openai`]), shared with the web package; what is the server's
//! own is here: completions' `prompt`, `logprobs`, and the errors as 400 responses.

use crate::{ChatMessage, GenerateOutput, GenerateRequest, LLM, Prompts};
use flint_core::chat::{ChatTemplate, ToolCallFormat};
use flint_core::openai::{Endpoint, OpenAiRequest, PromptInput, ToolUse};
use flint_core::tokenizer::Tokenizer;
use serde_json::{Value, json};

use super::api_error::ApiError;

/// Parses a request body (of completions or chat completions: [`OpenAiRequest`]; of
/// embeddings: [`flint_core::openai::EmbeddingRequest`]); a malformed one (not JSON, invalid
/// UTF-8, a field of the wrong type, an unknown field) is a 400 that says where.
pub fn parse_request<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
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

/// What [`plan`] needs of the served model: its chat prompts, how it calls tools, its context.
pub trait ServedModel {
    /// A conversation as prompt tokens, through the model's chat template, offering the model
    /// `tools` (OpenAI's `tools` objects).
    fn encode_chat(&self, messages: &[ChatMessage], tools: &[Value]) -> crate::Result<Vec<u32>>;

    /// What `request`'s tools ask of this model ([`OpenAiRequest::tool_use`]).
    fn tool_use(&self, request: &OpenAiRequest) -> flint_core::Result<ToolUse>;

    /// The most tokens one sequence may hold, prompt and generated together.
    fn max_sequence_tokens(&self) -> usize;
}

impl ServedModel for LLM {
    fn encode_chat(&self, messages: &[ChatMessage], tools: &[Value]) -> crate::Result<Vec<u32>> {
        Ok(self.chat_template()?.encode_with_tools(self.tokenizer(), messages, tools)?)
    }

    fn tool_use(&self, request: &OpenAiRequest) -> flint_core::Result<ToolUse> {
        let format = self.chat_template().ok().and_then(ChatTemplate::tool_format);
        request.tool_use(format, self.tokenizer())
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
    /// How to read tool calls out of the answer, when the model may make some.
    pub tool_format: Option<ToolCallFormat>,
}

/// Checks the request against the endpoint and the served model, and makes it an engine
/// request. Its `model` is not checked: the one model serves every request, whatever model it
/// names, as llama.cpp's server does (clients often send a fixed name), and the answer names
/// the model that served it.
pub fn plan(
    mut request: OpenAiRequest,
    endpoint: Endpoint,
    served: &impl ServedModel,
    rid: String,
) -> Result<Plan, ApiError> {
    let unsupported = |param: &str, what: &str| {
        Err(ApiError::invalid(format!("'{param}' {what} is not supported by flint"), Some(param)))
    };
    if request.echo == Some(true) {
        return unsupported("echo", "true");
    }
    if request.suffix.is_some() {
        return unsupported("suffix", "(insertion)");
    }
    let n = request.samples();
    let (return_logprob, top_logprobs_num) = logprobs_asked(&request, endpoint)?;
    if request.best_of.is_some_and(|best_of| best_of != n) {
        return unsupported("best_of", "other than n");
    }
    let mut tool_use = ToolUse::default();
    let (text, input_ids, prompts) = match endpoint {
        Endpoint::Chat => {
            if request.prompt.is_some() {
                return Err(ApiError::invalid(
                    "chat completions take 'messages', not 'prompt'",
                    Some("prompt"),
                ));
            }
            let messages = request
                .chat_messages()
                .ok_or_else(|| ApiError::invalid("'messages' is required", Some("messages")))?;
            tool_use = served.tool_use(&request).map_err(invalid_parameter)?;
            let ids = served.encode_chat(&messages, &tool_use.tools)?;
            (None, Some(Prompts::One(ids)), 1)
        }
        Endpoint::Completion => {
            if request.messages.is_some() {
                return Err(ApiError::invalid("completions take 'prompt', not 'messages'", Some("messages")));
            }
            if request.tools.is_some() || request.tool_choice.is_some() {
                return Err(ApiError::invalid(
                    "completions take no 'tools': use chat completions",
                    Some("tools"),
                ));
            }
            match request.prompt.take() {
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
    let max_new_tokens = match (endpoint, &input_ids) {
        (Endpoint::Chat, Some(Prompts::One(ids))) => {
            request.chat_max_new_tokens(ids.len(), served.max_sequence_tokens())
        }
        // OpenAI's default for a completion.
        _ => request.max_new_tokens().unwrap_or(16),
    };
    let mut sampling = request.sampling_params(max_new_tokens).map_err(|error| match error {
        // A `logit_bias` key that is not a token id.
        flint_core::Error::InvalidParameter { field, reason } => {
            ApiError::invalid(format!("{field} {reason}"), Some(field))
        }
        error => ApiError::from(error),
    })?;
    sampling.grammar = tool_use.grammar;
    Ok(Plan {
        request: GenerateRequest {
            text,
            input_ids,
            sampling,
            stream: request.streams(),
            return_logprob,
            top_logprobs_num,
            logprob_start_len: None,
            rid: Some(rid),
        },
        // Saturating: `n` is checked by the engine, which refuses more than a few.
        outputs: prompts.saturating_mul(n),
        n,
        stream: request.streams(),
        include_usage: request.include_usage(),
        tool_format: tool_use.format,
    })
}

/// An error of the request naming the field at fault (its tools, its embedding inputs) as a
/// 400; any other error as [`ApiError::from`] makes it.
pub fn invalid_parameter(error: flint_core::Error) -> ApiError {
    match error {
        flint_core::Error::InvalidParameter { field, reason } => {
            ApiError::invalid(format!("invalid '{field}': {reason}"), Some(field))
        }
        error => ApiError::from(error),
    }
}

/// `logprobs` (and `top_logprobs`) as (return logprobs, alternatives per token): a boolean for
/// chat, the number of alternatives for completions.
fn logprobs_asked(request: &OpenAiRequest, endpoint: Endpoint) -> Result<(bool, usize), ApiError> {
    const MOST: usize = 20;
    let (wanted, top) = match (endpoint, &request.logprobs) {
        (_, None | Some(Value::Null)) => (false, 0),
        (Endpoint::Chat, Some(Value::Bool(wanted))) => (*wanted, request.top_logprobs.unwrap_or(0)),
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
    if request.top_logprobs.is_some() && !(endpoint == Endpoint::Chat && wanted) {
        return Err(ApiError::invalid("'top_logprobs' needs 'logprobs': true", Some("top_logprobs")));
    }
    if top > MOST {
        let param = if endpoint == Endpoint::Chat { "top_logprobs" } else { "logprobs" };
        return Err(ApiError::invalid(format!("{top} alternatives per token: at most {MOST}"), Some(param)));
    }
    Ok((wanted, top))
}

/// An output's token logprobs in the endpoint's shape, or null when none were asked for.
/// `text_offset` is where the output's text starts in its choice's whole text (completions
/// give each token's offset).
pub fn logprobs(
    endpoint: Endpoint,
    tokenizer: &Tokenizer,
    output: &GenerateOutput,
    text_offset: &mut usize,
) -> Value {
    let Some(logprobs) = &output.meta_info.output_logprobs else { return Value::Null };
    let piece = |id: u32| tokenizer.decode(&[id], false).unwrap_or_default();
    match endpoint {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A served model without a GPU: every chat is three tokens.
    struct Fake;

    impl ServedModel for Fake {
        fn encode_chat(&self, _: &[ChatMessage], _: &[Value]) -> crate::Result<Vec<u32>> {
            Ok(vec![1, 2, 3])
        }

        fn tool_use(&self, _: &OpenAiRequest) -> flint_core::Result<ToolUse> {
            Ok(ToolUse::default())
        }

        fn max_sequence_tokens(&self) -> usize {
            64
        }
    }

    #[test]
    fn a_request_naming_any_model_is_planned_for_the_served_one() {
        for model in [r#""model": "gpt-4o-mini","#, r#""model": "some-other-model","#, ""] {
            let body =
                format!(r#"{{{model} "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 2}}"#);
            let request: OpenAiRequest = parse_request(body.as_bytes()).unwrap();
            let plan = plan(request, Endpoint::Chat, &Fake, "test".into())
                .unwrap_or_else(|error| panic!("{model}: {}", error.body()));
            assert!(matches!(plan.request.input_ids, Some(Prompts::One(ref ids)) if ids == &[1, 2, 3]));
        }
    }
}
