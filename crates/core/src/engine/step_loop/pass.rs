//! One step's forward pass, its readback and the draws of the sequences it completes.

use std::panic::AssertUnwindSafe;

#[cfg(feature = "fault-injection")]
use super::super::Fault;
use super::StepLoop;
use crate::engine::scheduler::Planned;
use crate::engine::sequence::Sequence;
use crate::error::panic_message;
use crate::gpu::{GpuContext, Tensor};
use crate::kernels::sample::{CandidateDepth, RowCandidates, top_candidates};
use crate::model::{LogitRows, SequenceChunk};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

impl StepLoop {
    /// Runs the forward pass of `planned`, then samples for every sequence whose chunk reached
    /// its last token. Returns the number of tokens sampled.
    ///
    /// When every row of logits is there to be sampled and each draw is greedy or top-k (see
    /// [`Sequence::samples_from_candidates`]), the pass ends with the search for each row's most
    /// likely tokens and only those are read back; a row whose candidates do not decide its
    /// draw is read back alone. Otherwise (prompt log-probabilities, logprobs, penalties,
    /// sampling from every token) the whole logits are read back.
    ///
    /// A sequence under a structured-output constraint computes the tokens its grammar allows
    /// while the GPU runs the pass, and draws among those only: from its candidates when one of
    /// them is allowed (the draw is then the same as from the masked row), else from its row.
    /// Unconstrained sequences in the batch draw exactly as they would without it.
    pub(super) async fn run_planned(&mut self, planned: &[Planned]) -> Result<usize> {
        #[cfg(feature = "fault-injection")]
        if self.take_fault(|fault| *fault == Fault::PanicInForwardPass) {
            panic!("fault injected: a panic in the forward pass");
        }
        let vocab = self.model.config().vocab_size;
        let running = &self.scheduler.running;
        let depth = candidate_depth(planned, running);
        let (logits, candidates) = {
            let chunks = planned
                .iter()
                .map(|p| {
                    let seq = &running[p.seq];
                    let table = seq.table.as_ref().ok_or_else(|| {
                        Error::InvalidBatch(format!("sequence {} is planned without a block table", seq.id))
                    })?;
                    Ok(SequenceChunk {
                        table,
                        tokens: &seq.tokens[p.positions.clone()],
                        first_position: p.positions.start,
                        logits: p.logits,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            self.model.forward_then(&self.cache, &chunks, None, |ctx, encoder, logits| {
                let Some(depth) = depth else { return Ok(None) };
                let rows = logits.shape()[0];
                let out = Tensor::empty(ctx, "candidates", &[rows, depth.words_per_row()])?;
                top_candidates(ctx, encoder, logits, depth, &out)?;
                Ok(Some((out, depth)))
            })?
        };
        // The GPU runs the step now: meanwhile, the constrained sequences about to draw find
        // the tokens their grammars allow.
        for p in planned.iter().filter(|p| p.rows() > 0) {
            let seq = &mut self.scheduler.running[p.seq];
            if p.positions.end == seq.tokens.len()
                && let Err(error) = seq.prepare_constraint()
            {
                seq.fail(error);
            }
        }
        let ctx = self.model.gpu().clone();
        let (rows, candidates) = match candidates {
            Some((out, depth)) => (Vec::new(), RowCandidates::parse(&out.to_u32(&ctx).await?, depth)),
            None if planned.iter().any(|p| p.rows() > 0) => (logits.to_f32(&ctx).await?, Vec::new()),
            None => (Vec::new(), Vec::new()),
        };
        let draws = StepDraws { ctx: &ctx, logits: &logits, vocab, candidates, rows };
        let mut generated = 0;
        let mut first_row = 0;
        for p in planned {
            #[cfg(feature = "fault-injection")]
            let panics = {
                let rid = self.scheduler.running[p.seq].request.rid.clone();
                let samples_now =
                    p.rows() > 0 && p.positions.end == self.scheduler.running[p.seq].tokens.len();
                samples_now && self.take_fault(|fault| *fault == Fault::PanicWhileSampling(rid.clone()))
            };
            #[cfg(not(feature = "fault-injection"))]
            let panics = false;
            let seq = &mut self.scheduler.running[p.seq];
            let row_range = first_row..first_row + p.rows();
            first_row += p.rows();
            if p.logits == LogitRows::All {
                seq.collect_input_logprobs(
                    p.positions.start,
                    &draws.rows[row_range.start * vocab..row_range.end * vocab],
                    vocab,
                );
            }
            seq.computed = p.positions.end;
            if self.prefix_cache
                && let Some(table) = seq.table.as_mut()
            {
                self.cache.cache_prefix(table, &seq.tokens[..seq.computed]);
            }
            if seq.computed < seq.tokens.len() || p.rows() == 0 || seq.finish.is_some() {
                continue;
            }
            match draws.draw(&self.tokenizer, seq, row_range.end - 1, panics).await {
                Ok(()) => generated += 1,
                Err(error) => seq.fail(error),
            }
        }
        Ok(generated)
    }
}

/// How deep the GPU's candidate search must go for the rows of `planned`: `None` when some row
/// is needed whole, or there are no rows.
fn candidate_depth(planned: &[Planned], running: &[Sequence]) -> Option<CandidateDepth> {
    let mut deepest = None;
    for p in planned.iter().filter(|p| p.rows() > 0) {
        let seq = &running[p.seq];
        let sampled_now = p.logits == LogitRows::Last && p.positions.end == seq.tokens.len();
        let needed = seq.samples_from_candidates().filter(|_| sampled_now)?;
        // A constrained draw takes the best allowed candidate: the deeper the search, the less
        // often the row is read back because no candidate is allowed.
        let depth =
            if needed == 1 && !seq.is_constrained() { CandidateDepth::Best } else { CandidateDepth::Top };
        deepest = Some(match deepest {
            Some(CandidateDepth::Top) => CandidateDepth::Top,
            _ => depth,
        });
    }
    deepest
}

/// What a step read back for its draws: each row's candidates, or the whole rows.
pub(super) struct StepDraws<'a> {
    pub ctx: &'a GpuContext,
    /// The step's logits `[rows, vocab]`, still on the GPU.
    pub logits: &'a Tensor,
    pub vocab: usize,
    /// Each row's candidates, when the step searched for them.
    pub candidates: Vec<RowCandidates>,
    /// The whole rows, when the step read them back instead.
    pub rows: Vec<f32>,
}

impl StepDraws<'_> {
    /// Draws `seq`'s next token from row `row`: from its candidates when they decide the draw,
    /// else from the row (read back alone when only candidates were). A panic while sampling
    /// (the sampler's bug; `inject_panic` fakes one) fails this sequence alone.
    pub async fn draw(
        &self,
        tokenizer: &Tokenizer,
        seq: &mut Sequence,
        row: usize,
        inject_panic: bool,
    ) -> Result<()> {
        let vocab = self.vocab;
        let from_candidates = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if inject_panic {
                panic!("fault injected: a panic while sampling");
            }
            self.candidates.get(row).map(|found| seq.sample_next_from(tokenizer, found))
        }));
        match from_candidates {
            Ok(Some(Ok(true))) => Ok(()),
            Ok(Some(Err(error))) => Err(error),
            Ok(Some(Ok(false))) => {
                let whole = read_row(self.ctx, self.logits, row, vocab).await?;
                sample_guarded(|| seq.sample_next(tokenizer, &whole))
            }
            Ok(None) => {
                sample_guarded(|| seq.sample_next(tokenizer, &self.rows[row * vocab..(row + 1) * vocab]))
            }
            Err(payload) => {
                Err(Error::StepFailed(format!("sampling panicked: {}", panic_message(&*payload))))
            }
        }
    }
}

/// Runs a draw, turning a panic into the sequence's error.
fn sample_guarded(draw: impl FnOnce() -> Result<()>) -> Result<()> {
    std::panic::catch_unwind(AssertUnwindSafe(draw)).unwrap_or_else(|payload| {
        Err(Error::StepFailed(format!("sampling panicked: {}", panic_message(&*payload))))
    })
}

/// Row `row` of `logits` `[rows, vocab]`, read back alone.
async fn read_row(ctx: &GpuContext, logits: &Tensor, row: usize, vocab: usize) -> Result<Vec<f32>> {
    let bytes = ctx.read_bytes(logits.buffer(), (row * vocab * 4) as u64, (vocab * 4) as u64).await?;
    Ok(bytemuck::pod_collect_to_vec(&bytes))
}
