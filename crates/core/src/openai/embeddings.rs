//! `/v1/embeddings` as flint speaks it (`flint serve`, and the web package's
//! `engine.embeddings.create`): the request's inputs made token ids, and the response built
//! from the engine's [`Embeddings`].

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::Embeddings;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// The body of an embeddings request. Unknown fields are refused, as for completions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// What to embed: a text, texts, token ids, or lists of token ids.
    pub input: super::PromptInput,
    /// The model's name (any name is the served model).
    pub model: Option<String>,
    /// `float` (the default) or `base64` (each vector's little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Fewer dimensions than the model's (Matryoshka models): refused, since flint returns the
    /// whole vector.
    pub dimensions: Option<usize>,
    /// An end-user id, for the caller's own bookkeeping: accepted and ignored.
    pub user: Option<String>,
}

impl EmbeddingRequest {
    /// The inputs as token ids: texts tokenized with the model's special tokens added (its BOS,
    /// and EOS where the model's metadata adds one, as embedding models such as
    /// Qwen3-Embedding need), ids as given. `dimensions` and an unknown `encoding_format` are
    /// errors naming the field.
    pub fn token_inputs(&self, tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>> {
        if self.dimensions.is_some() {
            return Err(Error::InvalidParameter {
                field: "dimensions",
                reason: "is not supported: flint returns the model's whole vector".into(),
            });
        }
        self.base64()?;
        let encode = |text: &str| tokenizer.encode(text, true, false);
        Ok(match &self.input {
            super::PromptInput::Text(text) => vec![encode(text)],
            super::PromptInput::Texts(texts) => texts.iter().map(|text| encode(text)).collect(),
            super::PromptInput::Ids(ids) => vec![ids.clone()],
            super::PromptInput::IdLists(lists) => lists.clone(),
        })
    }

    /// Whether vectors are answered as base64.
    fn base64(&self) -> Result<bool> {
        match self.encoding_format.as_deref() {
            None | Some("float") => Ok(false),
            Some("base64") => Ok(true),
            Some(other) => Err(Error::InvalidParameter {
                field: "encoding_format",
                reason: format!("'{other}' is neither 'float' nor 'base64'"),
            }),
        }
    }

    /// The response: a list of `embedding` objects in the inputs' order, `usage`, and `model`.
    pub fn response(&self, model: &str, embeddings: &Embeddings) -> Result<Value> {
        let base64 = self.base64()?;
        let data: Vec<Value> = embeddings
            .vectors
            .iter()
            .enumerate()
            .map(|(index, vector)| {
                let embedding = if base64 {
                    let bytes: Vec<u8> = vector.iter().flat_map(|value| value.to_le_bytes()).collect();
                    Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    vector.iter().map(|&value| Value::from(value)).collect()
                };
                json!({ "object": "embedding", "index": index, "embedding": embedding })
            })
            .collect();
        Ok(json!({
            "object": "list",
            "data": data,
            "model": model,
            "usage": { "prompt_tokens": embeddings.prompt_tokens, "total_tokens": embeddings.prompt_tokens },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: &str) -> EmbeddingRequest {
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn inputs_become_token_ids_and_vectors_come_back_as_floats_or_base64() {
        let tokenizer = crate::tokenizer::testing::byte_level(&["<unk>", "<s>", "</s>"], &[], Some(1), 2);
        let texts = request(r#"{"input": ["hi", "a"], "model": "x", "user": "u"}"#);
        assert_eq!(texts.token_inputs(&tokenizer).unwrap(), vec![vec![1, 3 + 104, 3 + 105], vec![1, 3 + 97]]);
        let ids = request(r#"{"input": [[5, 6], [7]]}"#);
        assert_eq!(ids.token_inputs(&tokenizer).unwrap(), vec![vec![5, 6], vec![7]]);
        assert_eq!(request(r#"{"input": [5, 6]}"#).token_inputs(&tokenizer).unwrap(), vec![vec![5, 6]]);

        let embeddings = Embeddings { vectors: vec![vec![1.0, -0.5]], prompt_tokens: 3 };
        let floats = request(r#"{"input": "x"}"#).response("m", &embeddings).unwrap();
        let expected = json!({"object": "list", "model": "m",
            "data": [{"object": "embedding", "index": 0, "embedding": [1.0, -0.5]}],
            "usage": {"prompt_tokens": 3, "total_tokens": 3}});
        assert_eq!(floats, expected);
        let encoded =
            request(r#"{"input": "x", "encoding_format": "base64"}"#).response("m", &embeddings).unwrap();
        // 1.0 and -0.5 as little-endian f32: 00 00 80 3f, 00 00 00 bf.
        assert_eq!(encoded["data"][0]["embedding"], "AACAPwAAAL8=");
    }

    #[test]
    fn unsupported_fields_are_named() {
        let tokenizer = crate::tokenizer::testing::byte_level(&["<unk>"], &[], None, 0);
        let field = |body: &str| match request(body).token_inputs(&tokenizer) {
            Err(Error::InvalidParameter { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(r#"{"input": "x", "dimensions": 8}"#), "dimensions");
        assert_eq!(field(r#"{"input": "x", "encoding_format": "int8"}"#), "encoding_format");
        let unknown =
            serde_json::from_str::<EmbeddingRequest>(r#"{"input": "x", "truncate": true}"#).unwrap_err();
        assert!(unknown.to_string().starts_with("unknown field `truncate`"));
    }
}
