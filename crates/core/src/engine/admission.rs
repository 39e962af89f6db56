//! Admission: a [`GenerateRequest`] checked and turned into the sequences the step loop runs
//! (one per prompt and sample), on the caller's side of the command channel, so a bad request
//! is refused before anything is queued and a grammar never compiles inside a step.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_channel::Sender;
use web_time::Instant;

use super::sequence::{RequestHandle, Sequence};
use super::{Engine, GenerateOutput, GenerateRequest};
use crate::grammar::{GrammarCompiler, TokenConstraint};
use crate::sample::{Sampler, SamplingParams};
use crate::{Error, Result};

impl Engine {
    /// Checks a request and turns it into sequences (one per prompt and sample).
    pub(super) fn prepare(
        &self,
        request: GenerateRequest,
        output: Sender<Result<GenerateOutput>>,
    ) -> Result<Vec<Sequence>> {
        let shared = &*self.shared;
        let prompts: Vec<Vec<u32>> = match (&request.text, &request.input_ids) {
            (Some(text), None) => {
                text.as_slice().iter().map(|t| shared.tokenizer.encode(t, true, true)).collect()
            }
            (None, Some(ids)) => ids.as_slice().to_vec(),
            _ => {
                return Err(Error::InvalidParameter {
                    field: "text",
                    reason: "give exactly one of `text` and `input_ids`".into(),
                });
            }
        };
        if prompts.is_empty() {
            return Err(Error::InvalidParameter { field: "text", reason: "the batch has no prompts".into() });
        }
        let params = &request.sampling;
        params.validate(shared.vocab_size)?;
        for prompt in &prompts {
            self.check_prompt(prompt, &request)?;
        }
        if request.top_logprobs_num > shared.vocab_size {
            return Err(Error::InvalidParameter {
                field: "top_logprobs_num",
                reason: format!(
                    "{} is more than the vocabulary's {} tokens",
                    request.top_logprobs_num, shared.vocab_size
                ),
            });
        }
        let constraint = self.compile_constraint(params)?;
        let request_number = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(RequestHandle {
            rid: request.rid.clone().unwrap_or_else(|| format!("flint-{request_number}")),
            stream: request.stream,
            return_logprob: request.return_logprob,
            top_logprobs_num: request.top_logprobs_num,
            logprob_start_len: request.logprob_start_len,
            submitted: Instant::now(),
            output,
        });
        let samples = params.n;
        let mut sequences = Vec::with_capacity(prompts.len() * samples);
        for (prompt_index, prompt) in prompts.into_iter().enumerate() {
            let mut leader = None;
            for sample in 0..samples {
                let index = prompt_index * samples + sample;
                let mut sample_params = params.clone();
                // Samples of one prompt differ by seed; each is reproducible on its own.
                sample_params.seed = params.seed.map(|s| s.wrapping_add(sample as u64));
                let fallback = mix_seed(shared.seed, request_number, index as u64);
                let sampler = Sampler::new(
                    sample_params,
                    fallback,
                    shared.vocab_size,
                    &prompt,
                    shared.tokenizer.end_of_generation(),
                )?;
                let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                let constraint = constraint.as_ref().map(TokenConstraint::fork);
                let mut sequence =
                    Sequence::new(id, index, handle.clone(), prompt.clone(), sampler, constraint);
                sequence.prompt_leader = leader;
                leader.get_or_insert(id);
                sequences.push(sequence);
            }
        }
        Ok(sequences)
    }

    /// Compiles the request's structured-output constraint, if it has one (on the caller's
    /// side: the step loop never waits for a compilation).
    fn compile_constraint(&self, params: &SamplingParams) -> Result<Option<TokenConstraint>> {
        let Some(constraint) = params.output_constraint()? else { return Ok(None) };
        let shared = &*self.shared;
        let compiler = shared.grammar.get_or_init(|| {
            GrammarCompiler::new(&shared.tokenizer, shared.vocab_size).map_err(|error| error.to_string())
        });
        match compiler {
            Ok(compiler) => compiler.compile(params),
            Err(reason) => Err(Error::InvalidParameter {
                field: constraint.field(),
                reason: format!("structured output is not available with this model: {reason}"),
            }),
        }
    }

    fn check_prompt(&self, prompt: &[u32], request: &GenerateRequest) -> Result<()> {
        let shared = &*self.shared;
        if prompt.is_empty() {
            return Err(Error::InvalidParameter { field: "text", reason: "a prompt has no tokens".into() });
        }
        if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= shared.vocab_size) {
            return Err(Error::TokenOutOfVocabulary { id: bad, vocab_size: shared.vocab_size });
        }
        let max_new = request.sampling.max_new_tokens;
        // Saturating: `max_new_tokens` comes from the caller, up to usize::MAX.
        let needed = prompt.len().saturating_add(max_new);
        for (limit, what) in [
            (shared.context_length, "the model's context"),
            (shared.kv_capacity_tokens, "the engine's KV cache"),
        ] {
            if needed > limit {
                return Err(Error::InvalidParameter {
                    field: "max_new_tokens",
                    reason: format!(
                        "the prompt has {} tokens and {max_new} new tokens were asked for, more than {what} of \
                         {limit} tokens; ask for at most {} new tokens or shorten the prompt",
                        prompt.len(),
                        limit.saturating_sub(prompt.len())
                    ),
                });
            }
        }
        if let Some(start) = request.logprob_start_len
            && start > prompt.len()
        {
            return Err(Error::InvalidParameter {
                field: "logprob_start_len",
                reason: format!("{start} is past the end of a prompt of {} tokens", prompt.len()),
            });
        }
        Ok(())
    }
}

/// A seed for a request without one: distinct per engine seed, request and sequence.
fn mix_seed(engine: u64, request: u64, index: u64) -> u64 {
    // splitmix64's finaliser over the three.
    let mut z =
        engine ^ request.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
