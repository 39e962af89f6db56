//! The request contract: what a caller asks [`Engine::generate`](super::Engine::generate) for,
//! and what each item of its stream carries (see "The request contract" in ARCHITECTURE.md).

use serde::{Deserialize, Serialize};

use crate::sample::SamplingParams;

/// One prompt, or a batch of them (one output per prompt).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompts<T> {
    /// A single prompt.
    One(T),
    /// Several prompts, answered independently; outputs carry their prompt's index.
    Batch(Vec<T>),
}

impl<T> Prompts<T> {
    /// The prompts in order.
    pub fn as_slice(&self) -> &[T] {
        match self {
            Prompts::One(one) => std::slice::from_ref(one),
            Prompts::Batch(many) => many,
        }
    }
}

/// A generation request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateRequest {
    /// The prompt text(s), tokenized with the model's tokenizer (BOS added as its metadata
    /// says; special tokens written in the text are parsed). Exactly one of `text` and
    /// `input_ids` is given.
    pub text: Option<Prompts<String>>,
    /// The prompt(s) as token ids.
    pub input_ids: Option<Prompts<Vec<u32>>>,
    /// How to choose tokens, and when to stop.
    #[serde(alias = "sampling_params")]
    pub sampling: SamplingParams,
    /// Incremental items as tokens are produced (`true`), or one item per prompt at the end.
    pub stream: bool,
    /// Return the log-probability of every generated token (and of the prompt's tokens from
    /// `logprob_start_len`, when given).
    pub return_logprob: bool,
    /// With `return_logprob`: also the this many most likely alternatives at each position.
    pub top_logprobs_num: usize,
    /// With `return_logprob`: the prompt position from which prompt tokens get log-probabilities
    /// (the token at position 0 has none: nothing predicts it). Prompt positions from here on
    /// are computed even when the prefix cache holds them.
    pub logprob_start_len: Option<usize>,
    /// The request's id, for [`Engine::abort`](super::Engine::abort); one is made up when absent.
    pub rid: Option<String>,
}

/// Why a sequence ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or stop string was produced.
    Stop {
        /// What matched.
        matched: StopMatch,
    },
    /// `max_new_tokens` tokens were generated.
    Length {
        /// The number of tokens generated.
        length: usize,
    },
    /// The request was aborted (by [`Engine::abort`](super::Engine::abort), or its stream was
    /// dropped).
    Abort,
}

/// What ended a sequence with [`FinishReason::Stop`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopMatch {
    /// An end-of-generation token or one of `stop_token_ids` (the last of `output_ids`), or the
    /// token that completed the output's `json_schema`, `regex` or `grammar`.
    Token(u32),
    /// One of the `stop` strings (cut from the text, never emitted).
    Text(String),
}

/// A token and its log-probability (natural log, over the model's raw distribution).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token.
    pub token_id: u32,
    /// Its log-probability.
    pub logprob: f64,
}

/// Log-probabilities of some positions: of each chosen (or prompt) token, and the most likely
/// alternatives when `top_logprobs_num` asked for them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Logprobs {
    /// Per position: the token that was there.
    pub tokens: Vec<TokenLogprob>,
    /// Per position: the `top_logprobs_num` most likely tokens, most likely first (empty lists
    /// when none were asked for).
    pub top: Vec<Vec<TokenLogprob>>,
}

impl Logprobs {
    pub(crate) fn push(&mut self, token: TokenLogprob, top: Vec<TokenLogprob>) {
        self.tokens.push(token);
        self.top.push(top);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// What is known of a request's sequence when an output item is sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetaInfo {
    /// The request's id (`rid`, or the one made up for it).
    pub id: String,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated so far.
    pub completion_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache instead of being computed.
    pub cached_tokens: usize,
    /// Why the sequence ended; `None` while it runs.
    pub finish_reason: Option<FinishReason>,
    /// Seconds from submission to this item.
    pub e2e_latency: f64,
    /// With `return_logprob`: the generated tokens' log-probabilities (in a stream, those of
    /// this item's tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_logprobs: Option<Logprobs>,
    /// With `return_logprob` and `logprob_start_len`: the prompt tokens' log-probabilities from
    /// that position (in a stream, on the first item).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_logprobs: Option<Logprobs>,
}

/// One item of a generation stream.
///
/// With `stream: false`, one item per prompt (and per sample of `n`) when it ends. With
/// `stream: true`, items carry the text and token ids produced since the previous item of the
/// same sequence, and the last one carries the finish reason: concatenated, they equal the
/// non-streamed output byte for byte.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerateOutput {
    /// Which sequence of the request: prompt index × `n` + sample index.
    pub index: usize,
    /// The text (or, streaming, the new text).
    pub text: String,
    /// The generated token ids (or, streaming, the new ones), a stop token included.
    pub output_ids: Vec<u32>,
    /// Counts, finish reason, latency and log-probabilities.
    pub meta_info: MetaInfo,
}
