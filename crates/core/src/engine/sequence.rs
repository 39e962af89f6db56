//! One sequence of a request as the step loop sees it: its tokens, how many of them the KV
//! cache holds, its sampler, and the output it owes its stream.

use std::sync::Arc;

use async_channel::Sender;
use web_time::Instant;

use crate::engine::request::{FinishReason, GenerateOutput, Logprobs, MetaInfo, StopMatch, TokenLogprob};
use crate::engine::stop::StopText;
use crate::grammar::TokenConstraint;
use crate::kernels::sample::RowCandidates;
use crate::kv::KvBlockTable;
use crate::sample::{Sampler, log_softmax, top_logprobs};
use crate::tokenizer::{Detokenizer, Tokenizer};
use crate::{Error, Result};

/// What the sequences of one request share.
pub(crate) struct RequestHandle {
    pub rid: String,
    pub stream: bool,
    pub return_logprob: bool,
    pub top_logprobs_num: usize,
    pub logprob_start_len: Option<usize>,
    pub submitted: Instant,
    pub output: Sender<Result<GenerateOutput>>,
}

impl RequestHandle {
    /// True when nobody listens any more: the stream was dropped.
    pub fn abandoned(&self) -> bool {
        self.output.is_closed()
    }
}

/// A sequence: prompt and generated tokens, and its progress through the KV cache.
pub(crate) struct Sequence {
    /// Engine-wide unique id.
    pub id: u64,
    /// Index of the output within its request.
    pub index: usize,
    pub request: Arc<RequestHandle>,
    pub prompt_len: usize,
    /// The prompt, then every generated token.
    pub tokens: Vec<u32>,
    /// Tokens from position 0 whose keys and values the KV cache holds.
    pub computed: usize,
    /// The sequence's blocks while it is running; `None` while it waits.
    pub table: Option<KvBlockTable>,
    pub sampler: Sampler,
    /// The structured-output constraint, when the request has one.
    constraint: Option<TokenConstraint>,
    /// Prompt tokens taken from the prefix cache when first admitted.
    pub cached_tokens: Option<usize>,
    /// For samples 2.. of a prompt (`n` > 1): the sequence of its first sample, whose prompt
    /// blocks they share through the prefix cache once it has computed them.
    pub prompt_leader: Option<u64>,
    detokenizer: Detokenizer,
    text: StopText,
    /// Prompt log-probabilities collected so far, and whether they have been sent.
    input_logprobs: Logprobs,
    input_logprobs_sent: bool,
    /// Output log-probabilities: all of them (not streaming) or those not yet sent (streaming).
    output_logprobs: Logprobs,
    /// Generated ids not yet sent (streaming).
    unsent_ids: Vec<u32>,
    pub finish: Option<FinishReason>,
    /// The sequence ended with an error, already sent: nothing more goes to its stream.
    failed: bool,
}

impl Sequence {
    pub fn new(
        id: u64,
        index: usize,
        request: Arc<RequestHandle>,
        prompt: Vec<u32>,
        sampler: Sampler,
        constraint: Option<TokenConstraint>,
    ) -> Self {
        let params = sampler.params();
        let detokenizer = Detokenizer::after_prompt(params.skip_special_tokens);
        let text = StopText::new(params.stop.clone());
        Sequence {
            id,
            index,
            request,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            table: None,
            sampler,
            constraint,
            cached_tokens: None,
            prompt_leader: None,
            detokenizer,
            text,
            input_logprobs: Logprobs::default(),
            input_logprobs_sent: false,
            output_logprobs: Logprobs::default(),
            unsent_ids: Vec::new(),
            finish: None,
            failed: false,
        }
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// True while prompt log-probabilities are owed: prompt positions from `logprob_start_len`
    /// need logits rows, so the prefix cache must not skip them.
    pub fn wants_input_logprobs(&self) -> bool {
        self.request.return_logprob && self.request.logprob_start_len.is_some() && !self.input_logprobs_sent
    }

    /// The most prompt tokens the prefix cache may supply: all but the last (whose logits give
    /// the first new token), and none from where prompt log-probabilities start.
    pub fn max_cached_tokens(&self) -> usize {
        let mut limit = self.tokens.len() - 1;
        if self.wants_input_logprobs()
            && let Some(start) = self.request.logprob_start_len
        {
            limit = limit.min(start.saturating_sub(1));
        }
        limit
    }

    /// Takes prompt log-probabilities from the logits `rows` (`vocab` wide) of positions
    /// `first_position ..`: row `i` predicts the token at `first_position + i + 1`.
    pub fn collect_input_logprobs(&mut self, first_position: usize, rows: &[f32], vocab: usize) {
        let Some(start) = self.request.logprob_start_len else { return };
        for (offset, row) in rows.chunks_exact(vocab).enumerate() {
            let predicted = first_position + offset + 1;
            if predicted < start.max(1) || predicted >= self.prompt_len {
                continue;
            }
            let entry = logprob_entry(row, self.tokens[predicted], self.request.top_logprobs_num);
            self.input_logprobs.push(entry.0, entry.1);
        }
    }

    /// True when the next token can be drawn from the GPU's candidates of its row (see
    /// [`Sampler::sample_candidates`]), so that the whole row need not be read back.
    pub fn samples_from_candidates(&self) -> Option<usize> {
        if self.request.return_logprob { None } else { self.sampler.candidates_needed() }
    }

    /// True when `position` holds the sequence's last token and the KV cache everything before
    /// it: the next pass feeds that token there and draws from its row.
    pub fn awaits_position(&self, position: usize) -> bool {
        self.computed == position && self.tokens.len() == position + 1
    }

    /// True while the sequence runs and its next draw is its row's most likely token, which the
    /// GPU finds itself: its steps may overlap (`step_loop/overlap.rs`).
    pub fn draws_on_gpu(&self) -> bool {
        self.finish.is_none() && self.samples_from_candidates() == Some(1) && !self.is_constrained()
    }

    /// Whether a structured-output constraint masks this sequence's draws.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Computes the tokens the constraint allows next (nothing to do without one): the engine
    /// calls this while the GPU runs the step that produces the logits they mask.
    pub fn prepare_constraint(&mut self) -> Result<()> {
        self.constraint.as_mut().map_or(Ok(()), TokenConstraint::compute_mask)
    }

    /// Samples the next token from the logits `row` of the last token, and decides whether the
    /// sequence ends with it.
    pub fn sample_next(&mut self, tokenizer: &Tokenizer, row: &[f32]) -> Result<()> {
        let allowed = self.constraint.as_mut().map(TokenConstraint::allowed).transpose()?;
        let token = self.sampler.sample_allowed(row, allowed)?;
        if self.request.return_logprob {
            let (entry, top) = logprob_entry(row, token, self.request.top_logprobs_num);
            self.output_logprobs.push(entry, top);
        }
        self.push_token(tokenizer, token)
    }

    /// Samples the next token from the GPU's candidates of its row; `Ok(false)`, with nothing
    /// drawn, when they do not decide the draw and [`Sequence::sample_next`] needs the row.
    pub fn sample_next_from(&mut self, tokenizer: &Tokenizer, candidates: &RowCandidates) -> Result<bool> {
        if self.request.return_logprob {
            return Ok(false);
        }
        let allowed = self.constraint.as_mut().map(TokenConstraint::allowed).transpose()?;
        match self.sampler.sample_candidates_allowed(&candidates.tokens, candidates.let_go, allowed) {
            Some(token) => self.push_token(tokenizer, token).map(|()| true),
            None => Ok(false),
        }
    }

    /// Appends a sampled token and decides whether the sequence ends with it: a stop token, a
    /// stop string, the end of the constraint's grammar, or `max_new_tokens`.
    fn push_token(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<()> {
        let grammar_complete = match self.constraint.as_mut() {
            Some(constraint) => constraint.commit(token)?,
            None => false,
        };
        self.tokens.push(token);
        self.unsent_ids.push(token);
        if self.sampler.is_stop_token(token) {
            self.finish_text();
            self.finish = Some(FinishReason::Stop { matched: StopMatch::Token(token) });
            return Ok(());
        }
        let piece = self.detokenizer.push(tokenizer, token)?;
        if let Some(stop) = self.text.push(&piece) {
            self.finish = Some(FinishReason::Stop { matched: StopMatch::Text(stop) });
            return Ok(());
        }
        if grammar_complete {
            self.finish_text();
            self.finish.get_or_insert(FinishReason::Stop { matched: StopMatch::Token(token) });
            return Ok(());
        }
        if self.generated() >= self.sampler.params().max_new_tokens {
            self.finish_text();
            self.finish.get_or_insert(FinishReason::Length { length: self.generated() });
        }
        Ok(())
    }

    /// Forgets the sequence's progress through the KV cache after preemption: it is computed
    /// again from its tokens, prompt log-probabilities not sent yet included.
    pub fn reset_for_recompute(&mut self) {
        self.computed = 0;
        if !self.input_logprobs_sent {
            self.input_logprobs = Logprobs::default();
        }
    }

    /// Ends the sequence as aborted.
    pub fn abort(&mut self) {
        if self.finish.is_none() {
            self.finish_text();
            self.finish = Some(FinishReason::Abort);
        }
    }

    /// Ends the sequence with `error`, which its stream receives as its last item.
    pub fn fail(&mut self, error: Error) {
        if !self.failed {
            let _ = self.request.output.try_send(Err(error));
        }
        self.failed = true;
        self.finish.get_or_insert(FinishReason::Abort);
    }

    /// The bytes of an unfinished character become text; a stop string they complete still
    /// counts.
    fn finish_text(&mut self) {
        let rest = self.detokenizer.finish();
        if let Some(stop) = self.text.push(&rest) {
            self.finish = Some(FinishReason::Stop { matched: StopMatch::Text(stop) });
        }
    }

    /// The item this sequence owes its stream now: streaming, whatever is new (`None` when
    /// nothing is); not streaming, the whole output once finished.
    pub fn take_output(&mut self) -> Option<GenerateOutput> {
        if self.failed {
            return None;
        }
        let finished = self.finish.is_some();
        let (text, output_ids, output_logprobs) = if self.request.stream {
            let text = if finished { self.text.take_rest() } else { self.text.take_ready() };
            let fresh_input = self.wants_input_logprobs_unsent();
            if text.is_empty() && self.unsent_ids.is_empty() && !finished && !fresh_input {
                return None;
            }
            (text, std::mem::take(&mut self.unsent_ids), std::mem::take(&mut self.output_logprobs))
        } else if finished {
            (
                self.text.text().to_string(),
                self.tokens[self.prompt_len..].to_vec(),
                std::mem::take(&mut self.output_logprobs),
            )
        } else {
            return None;
        };
        let input_logprobs = if self.request.return_logprob
            && self.request.logprob_start_len.is_some()
            && !self.input_logprobs_sent
            && (self.computed >= self.prompt_len || finished)
        {
            self.input_logprobs_sent = true;
            Some(std::mem::take(&mut self.input_logprobs))
        } else {
            None
        };
        Some(GenerateOutput {
            index: self.index,
            text,
            output_ids,
            meta_info: MetaInfo {
                id: self.request.rid.clone(),
                prompt_tokens: self.prompt_len,
                completion_tokens: self.generated(),
                cached_tokens: self.cached_tokens.unwrap_or(0),
                finish_reason: self.finish.clone(),
                e2e_latency: self.request.submitted.elapsed().as_secs_f64(),
                output_logprobs: self.request.return_logprob.then_some(output_logprobs),
                input_logprobs,
            },
        })
    }

    /// Prompt log-probabilities are complete but not sent yet.
    fn wants_input_logprobs_unsent(&self) -> bool {
        self.wants_input_logprobs() && self.computed >= self.prompt_len && !self.input_logprobs.is_empty()
    }
}

/// The log-probability of `token` in `row`, and the `top` most likely tokens.
fn logprob_entry(row: &[f32], token: u32, top: usize) -> (TokenLogprob, Vec<TokenLogprob>) {
    let logprobs = log_softmax(row);
    let entry = TokenLogprob { token_id: token, logprob: logprobs[token as usize] };
    let top = top_logprobs(&logprobs, top)
        .into_iter()
        .map(|(token_id, logprob)| TokenLogprob { token_id, logprob })
        .collect();
    (entry, top)
}
