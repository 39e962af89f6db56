//! The JS side's `prompt` and `params` as the engine's [`GenerateRequest`].
//!
//! `params` is flat, as JS callers write it: the sampling parameters of the request contract
//! (`max_new_tokens`, `temperature`, `top_p`, `stop`, `seed`, ...) beside the request's own
//! fields (`return_logprob`, `top_logprobs_num`, `logprob_start_len`, `rid`). An unknown field
//! or a value of the wrong type is an error naming it; the engine checks the ranges.

use flint_core::engine::{GenerateRequest, Prompts};
use flint_core::sample::SamplingParams;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result, from_json};

/// One prompt: a text, or token ids used as given.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// The fields of `params` that belong to the request rather than to its sampling.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RequestFields {
    return_logprob: bool,
    top_logprobs_num: usize,
    logprob_start_len: Option<usize>,
    rid: Option<String>,
}

const REQUEST_FIELDS: [&str; 4] = ["return_logprob", "top_logprobs_num", "logprob_start_len", "rid"];

/// The request for `prompt_json` (a JSON string or array of token ids) with `params_json` (a
/// JSON object, or `null` for the defaults).
pub(crate) fn generate_request(
    prompt_json: &str,
    params_json: &str,
    stream: bool,
) -> Result<GenerateRequest> {
    let prompt = serde_json::from_str::<Prompt>(prompt_json).map_err(|_| {
        Error::invalid("prompt", "a prompt is a string or an array of token ids (integers ≥ 0)")
    })?;
    let params: Option<Map<String, Value>> = from_json(params_json, "params")?;
    let mut sampling_fields = params.unwrap_or_default();
    let mut request_fields = Map::new();
    for field in REQUEST_FIELDS {
        if let Some(value) = sampling_fields.remove(field) {
            request_fields.insert(field.to_string(), value);
        }
    }
    let request: RequestFields = from_value(Value::Object(request_fields))?;
    let sampling: SamplingParams = from_value(Value::Object(sampling_fields))?;
    let (text, input_ids) = match prompt {
        Prompt::Text(text) => (Some(Prompts::One(text)), None),
        Prompt::Ids(ids) => (None, Some(Prompts::One(ids))),
    };
    Ok(GenerateRequest {
        text,
        input_ids,
        sampling,
        stream,
        return_logprob: request.return_logprob,
        top_logprobs_num: request.top_logprobs_num,
        logprob_start_len: request.logprob_start_len,
        rid: request.rid,
    })
}

/// Reads a part of `params` into a `T`, naming the field that is wrong.
fn from_value<T: serde::de::DeserializeOwned>(value: Value) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let field = if path == "." { "params".to_string() } else { path };
        Error::invalid(field, error.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_params_split_into_request_and_sampling() {
        let request = generate_request(
            r#""Hello""#,
            r#"{"temperature": 0, "max_new_tokens": 5, "stop": ["."], "rid": "r1", "return_logprob": true}"#,
            true,
        )
        .unwrap();
        assert_eq!(request.text, Some(Prompts::One("Hello".to_string())));
        assert_eq!(request.sampling.temperature, 0.0);
        assert_eq!(request.sampling.max_new_tokens, 5);
        assert_eq!(request.sampling.stop, vec![".".to_string()]);
        assert_eq!(request.rid.as_deref(), Some("r1"));
        assert!(request.return_logprob && request.stream);
    }

    #[test]
    fn token_ids_are_a_prompt_and_null_params_are_the_defaults() {
        let request = generate_request("[1, 2, 3]", "null", false).unwrap();
        assert_eq!(request.input_ids, Some(Prompts::One(vec![1, 2, 3])));
        assert_eq!(request.sampling, SamplingParams::default());
    }

    #[test]
    fn errors_name_the_field() {
        let message =
            |prompt: &str, params: &str| generate_request(prompt, params, false).unwrap_err().to_string();
        assert!(message(r#""x""#, r#"{"temperature": "hot"}"#).contains("'temperature'"));
        assert!(message(r#""x""#, r#"{"temprature": 1}"#).contains("temprature"));
        assert!(message(r#""x""#, r#"{"rid": 7}"#).contains("'rid'"));
        assert!(message("[-1]", "{}").contains("'prompt'"));
        assert!(message(r#""x""#, "[1]").contains("'params'"));
    }
}
