//! `engine.chat.completions.create(...)`: OpenAI's chat request body made an engine request.
//! The request and response shapes are flint-core's ([`flint_core::openai`]), the same as
//! `flint serve`'s `/v1/chat/completions`; what is the browser's own is here: it serves chat
//! only, without logprobs, so the fields of completions and of logprobs are errors naming them.
//! `signal` is the JS wrapper's and never gets here.

use flint_core::chat::{ChatMessage, ToolCallFormat};
use flint_core::engine::{GenerateRequest, Prompts};
use flint_core::openai::{OpenAiRequest, ToolUse, field_name};
use serde_json::Value;

use crate::error::{Error, Result};

/// A chat request made ready for the engine, and how to answer it.
pub(crate) struct ChatPlan {
    pub request: GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// The `model` of the response objects.
    pub model: Option<String>,
    /// How to read tool calls out of the answer, when the model may make some.
    pub tool_format: Option<ToolCallFormat>,
}

/// The engine request of a chat, its prompt made by `encode_chat` (offering the model
/// `tool_use`'s tools), its output under `tool_use`'s grammar. `max_sequence_tokens` bounds the
/// default `max_tokens` (as many as the context has left, as OpenAI does).
pub(crate) fn plan(
    request: OpenAiRequest,
    tool_use: ToolUse,
    encode_chat: impl FnOnce(&[ChatMessage], &[Value]) -> Result<Vec<u32>>,
    max_sequence_tokens: usize,
    rid: String,
) -> Result<ChatPlan> {
    refuse_unsupported(&request)?;
    let messages = request.chat_messages().unwrap_or_default();
    if messages.is_empty() {
        return Err(Error::invalid("messages", "at least one message is needed"));
    }
    let ids = encode_chat(&messages, &tool_use.tools)?;
    let max_new_tokens = request.chat_max_new_tokens(ids.len(), max_sequence_tokens);
    let mut sampling = request.sampling_params(max_new_tokens).map_err(|error| chat_error(error.into()))?;
    sampling.grammar = tool_use.grammar;
    let stream = request.streams();
    Ok(ChatPlan {
        request: GenerateRequest {
            input_ids: Some(Prompts::One(ids)),
            sampling,
            stream,
            rid: Some(rid),
            ..GenerateRequest::default()
        },
        stream,
        include_usage: request.include_usage(),
        model: request.model,
        tool_format: tool_use.format,
    })
}

/// An error of a chat request, a parameter that the engine refused named as the request names
/// it (`max_tokens`, `response_format`), not as the engine's request contract does.
pub(crate) fn chat_error(error: Error) -> Error {
    match error {
        Error::Core(flint_core::Error::InvalidParameter { field, reason }) => {
            Error::invalid(field_name(field), reason)
        }
        error => error,
    }
}

/// The fields of OpenAI's requests that the browser does not take: those of completions, and
/// logprobs (not supported in the browser yet).
fn refuse_unsupported(request: &OpenAiRequest) -> Result<()> {
    let given = [
        ("prompt", request.prompt.is_some()),
        ("logprobs", request.logprobs.is_some()),
        ("top_logprobs", request.top_logprobs.is_some()),
        ("echo", request.echo.is_some()),
        ("suffix", request.suffix.is_some()),
        ("best_of", request.best_of.is_some()),
    ];
    match given.into_iter().find(|&(_, given)| given) {
        Some((field, _)) => Err(Error::invalid(field, "not supported by chat completions in the browser")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::from_json;

    fn chat(body: &str) -> Result<ChatPlan> {
        let request: OpenAiRequest = from_json(body, "request")?;
        let encode =
            |messages: &[ChatMessage], tools: &[Value]| Ok(vec![messages.len() as u32, tools.len() as u32]);
        plan(request, ToolUse::default(), encode, 100, "chatcmpl-1".into())
    }

    #[test]
    fn a_chat_request_becomes_an_engine_request() {
        let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 4,
                       "stop": "\n", "seed": -1, "stream": true, "stream_options": {"include_usage": true}}"#;
        let plan = chat(body).unwrap();
        assert_eq!(plan.request.input_ids, Some(Prompts::One(vec![1, 0])));
        assert_eq!(plan.request.sampling.max_new_tokens, 4);
        assert_eq!(plan.request.sampling.stop, vec!["\n".to_string()]);
        assert_eq!(plan.request.sampling.seed, Some(u64::MAX));
        assert!(plan.stream && plan.include_usage && plan.request.stream);
    }

    #[test]
    fn max_tokens_defaults_to_the_context_left() {
        let plan = chat(r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}"#);
        assert_eq!(plan.unwrap().request.sampling.max_new_tokens, 98);
    }

    #[test]
    fn unknown_unsupported_and_mistyped_fields_are_named() {
        let message = |body: &str| chat(body).err().unwrap().to_string();
        let unknown = message(r#"{"messages": [], "temprature": 1}"#);
        assert!(unknown.starts_with("invalid 'temprature': unknown field `temprature`"), "{unknown}");
        let unsupported = [
            ("prompt", r#""x""#),
            ("logprobs", "true"),
            ("top_logprobs", "1"),
            ("echo", "true"),
            ("suffix", r#""x""#),
            ("best_of", "1"),
        ];
        for (field, value) in unsupported {
            let refused = message(&format!(r#"{{"messages": [], "{field}": {value}}}"#));
            assert!(refused.starts_with(&format!("invalid '{field}': not supported")), "{refused}");
        }
        let mistyped = message(r#"{"messages": [], "temperature": "hot"}"#);
        assert!(mistyped.starts_with("invalid 'temperature'"), "{mistyped}");
        assert!(message(r#"{"messages": []}"#).starts_with("invalid 'messages'"));
        assert!(message("{}").starts_with("invalid 'messages'"));
        let bias = message(r#"{"messages": [{"role": "user", "content": "Hi"}], "logit_bias": {"x": 1}}"#);
        assert_eq!(bias, "invalid 'logit_bias': keys are token ids; 'x' is not one");
    }

    #[test]
    fn an_engine_error_names_the_field_of_the_request() {
        let schema = flint_core::Error::InvalidParameter {
            field: "json_schema",
            reason: "it does not compile".into(),
        };
        assert_eq!(chat_error(schema.into()).to_string(), "invalid 'response_format': it does not compile");
        let max = flint_core::Error::InvalidParameter { field: "max_new_tokens", reason: "too many".into() };
        assert_eq!(chat_error(max.into()).to_string(), "invalid 'max_tokens': too many");
        assert!(matches!(chat_error(Error::Unloaded), Error::Unloaded));
    }
}
