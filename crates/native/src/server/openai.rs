//! OpenAI's request bodies, checked against the endpoint they came to and the served model and
//! made engine requests, and the logprobs of its answers. The shapes of requests and answers
//! are flint-core's ([`flint_core::openai`]), shared with the web package; what is the server's
//! own is here: completions' `prompt`, `logprobs`, and the errors as 400 responses.

use crate::{ChatMessage, GenerateOutput, GenerateRequest, LLM, Prompts};
use flint_core::openai::{Endpoint, OpenAiRequest, PromptInput};
use flint_core::tokenizer::Tokenizer;
use serde_json::{Value, json};

use super::api_error::ApiError;

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

/// What [`plan`] needs of the served model: its chat prompts and its context.
pub trait ServedModel {
    /// A conversation as prompt tokens, through the model's chat template.
    fn encode_chat(&self, messages: &[ChatMessage]) -> crate::Result<Vec<u32>>;

    /// The most tokens one sequence may hold, prompt and generated together.
    fn max_sequence_tokens(&self) -> usize;
}

impl ServedModel for LLM {
    fn encode_chat(&self, messages: &[ChatMessage]) -> crate::Result<Vec<u32>> {
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

/// Checks the request against the endpoint and the served model, and makes it an engine
/// request.
pub fn plan(
    mut request: OpenAiRequest,
    endpoint: Endpoint,
    model_id: &str,
    served: &impl ServedModel,
    rid: String,
) -> Result<Plan, ApiError> {
    if let Some(model) = &request.model
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
            let ids = served.encode_chat(&messages)?;
            (None, Some(Prompts::One(ids)), 1)
        }
        Endpoint::Completion => {
            if request.messages.is_some() {
                return Err(ApiError::invalid("completions take 'prompt', not 'messages'", Some("messages")));
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
    let sampling = request.sampling_params(max_new_tokens).map_err(|error| match error {
        // A `logit_bias` key that is not a token id.
        flint_core::Error::InvalidParameter { field, reason } => {
            ApiError::invalid(format!("{field} {reason}"), Some(field))
        }
        error => ApiError::from(error),
    })?;
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
    })
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
