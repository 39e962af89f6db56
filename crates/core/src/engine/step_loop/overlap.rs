//! Overlapped decode steps: the host records and submits step N+1 while the GPU runs step N.
//!
//! When every running sequence decodes and draws greedily, a step's draws are its rows' most
//! likely tokens, which the GPU finds itself. Those tokens stay on the GPU and feed the next
//! step's embedding ([`GpuTokens`]): the loop submits step N+1, then reads step N's candidates
//! back and applies them (stop tokens, stop strings, `max_new_tokens`, aborts), one step late.
//! A sequence that ends with step N's token has its row of step N+1 discarded, and the KV slot
//! that row wrote goes back with its blocks when the sequence retires.
//!
//! The host draws every token from the read-back candidates exactly as the synchronous path
//! does. Where its draw is not the token the GPU fed on (a tie the candidates leave open, read
//! from the whole row), that sequence's next row is discarded and its position computed again
//! from the host's token: outputs are the same with the overlap on or off.

#[cfg(feature = "fault-injection")]
use super::super::Fault;
use super::StepLoop;
use super::pass::StepDraws;
use crate::Result;
use crate::engine::scheduler::Planned;
use crate::gpu::{Readback, Tensor};
use crate::kernels::sample::{CandidateDepth, RowCandidates, top_candidates};
use crate::model::{GpuTokens, LogitRows, SequenceChunk};

/// The candidate search of an overlapped step: the most likely token of each row.
const DEPTH: CandidateDepth = CandidateDepth::Best;

/// A decode step submitted whose draws the host has not applied yet.
pub(super) struct InFlight {
    /// Each row's sequence (by id) and the position of the token it was fed.
    rows: Vec<(u64, usize)>,
    logits: Tensor,
    /// `[rows, DEPTH.words_per_row()]`: the draws, and the next step's token ids.
    candidates: Tensor,
    readback: Readback,
    /// Sequences whose row is discarded: it was fed a token that is not the host's draw.
    discarded: Vec<u64>,
}

impl InFlight {
    /// The ids of the step's sequences.
    pub fn sequence_ids(&self) -> Vec<u64> {
        self.rows.iter().map(|&(id, _)| id).collect()
    }
}

impl StepLoop {
    /// Whether the planned step can be submitted overlapped: every running sequence decodes
    /// one token in it and draws its next greedily.
    pub(super) fn overlaps(&self, planned: &[Planned]) -> bool {
        let running = &self.scheduler.running;
        self.scheduler.overlaps_steps()
            && planned.len() == running.len()
            && planned.iter().all(|p| {
                let seq = &running[p.seq];
                p.positions.len() == 1
                    && seq.awaits_position(p.positions.start)
                    && p.logits == LogitRows::Last
                    && seq.draws_on_gpu()
            })
    }

    /// Submits a decode step of running sequences `rows` (index, position), fed their tokens
    /// from the host, or from the draws of `previous` (whose rows are the same sequences in the
    /// same order), and leaves its draws to be applied later.
    pub(super) fn submit_overlapped(
        &mut self,
        rows: &[(usize, usize)],
        previous: Option<&InFlight>,
    ) -> Result<InFlight> {
        #[cfg(feature = "fault-injection")]
        if self.take_fault(|fault| *fault == Fault::PanicInForwardPass) {
            panic!("fault injected: a panic in the forward pass");
        }
        let running = &self.scheduler.running;
        let chunks = rows
            .iter()
            .map(|&(index, position)| {
                let seq = &running[index];
                let table = seq.table.as_ref().ok_or_else(|| {
                    crate::Error::InvalidBatch(format!(
                        "sequence {} is planned without a block table",
                        seq.id
                    ))
                })?;
                // Fed from the GPU, the host's token is a placeholder the copy overwrites.
                let tokens = if previous.is_some() { &[0][..] } else { &seq.tokens[position..position + 1] };
                Ok(SequenceChunk { table, tokens, first_position: position, logits: LogitRows::Last })
            })
            .collect::<Result<Vec<_>>>()?;
        let row_bytes = (DEPTH.words_per_row() * 4) as u64;
        let fed: Vec<(usize, u64)> = (0..rows.len()).map(|row| (row, row as u64 * row_bytes)).collect();
        let gpu_tokens = previous.map(|previous| GpuTokens { source: &previous.candidates, tokens: &fed });
        let (logits, (candidates, mut readback)) =
            self.model.forward_then(&self.cache, &chunks, gpu_tokens, |ctx, encoder, logits| {
                let candidates = Tensor::empty(ctx, "candidates", &[rows.len(), DEPTH.words_per_row()])?;
                top_candidates(ctx, encoder, logits, DEPTH, &candidates)?;
                let readback =
                    ctx.record_readback(encoder, candidates.buffer(), 0, candidates.len() as u64 * 4)?;
                Ok((candidates, readback))
            })?;
        readback.start(self.model.gpu());
        let rows = rows.iter().map(|&(index, position)| (running[index].id, position)).collect();
        Ok(InFlight { rows, logits, candidates, readback, discarded: Vec::new() })
    }

    /// One overlapped step: submits the step after `previous` when the same sequences go on,
    /// then applies `previous`'s draws. Returns the tokens drawn.
    pub(super) async fn step_overlapped(&mut self, previous: InFlight) -> Result<usize> {
        let mut next = match self.next_rows(&previous) {
            Some(rows) => {
                let next = self.submit_overlapped(&rows, Some(&previous))?;
                self.counters.overlapped_steps += 1;
                Some(next)
            }
            None => None,
        };
        let generated = self.apply(previous, next.as_mut()).await?;
        self.in_flight = next;
        Ok(generated)
    }

    /// The rows (running index, position) of the step after `previous`, with their positions
    /// reserved in the KV cache: `None` when the overlap stops here (a sequence ended or was
    /// discarded, a request waits for room in the batch, a sequence is one token from its
    /// limit or draws otherwise, or the cache is full).
    fn next_rows(&mut self, previous: &InFlight) -> Option<Vec<(usize, usize)>> {
        if self.scheduler.would_admit() {
            return None;
        }
        let running = &self.scheduler.running;
        let same = running.len() == previous.rows.len()
            && running.iter().zip(&previous.rows).all(|(seq, &(id, position))| {
                seq.id == id
                    && seq.draws_on_gpu()
                    && seq.awaits_position(position)
                    && seq.generated() + 1 < seq.sampler.params().max_new_tokens
                    && !previous.discarded.contains(&id)
            });
        if !same {
            return None;
        }
        let mut rows = Vec::with_capacity(running.len());
        for (index, &(_, position)) in previous.rows.iter().enumerate() {
            let table = self.scheduler.running[index].table.as_mut()?;
            let missing = (position + 2).saturating_sub(table.tokens());
            // What is reserved and not used now is used by the next synchronous step.
            self.cache.append(table, missing).ok()?;
            rows.push((index, position + 1));
        }
        Some(rows)
    }

    /// Reads back `step`'s draws and applies them to its sequences that are still running and
    /// were fed the host's tokens; a draw that differs from the token `next` was fed discards
    /// that sequence's row of `next`. Returns the tokens drawn.
    async fn apply(&mut self, step: InFlight, mut next: Option<&mut InFlight>) -> Result<usize> {
        let InFlight { rows, logits, readback, discarded, .. } = step;
        let ctx = self.model.gpu().clone();
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&readback.finish(&ctx).await?);
        let vocab = self.model.config().vocab_size;
        let candidates = RowCandidates::parse(&words, DEPTH);
        let draws = StepDraws { ctx: &ctx, logits: &logits, vocab, candidates, rows: Vec::new() };
        let mut generated = 0;
        for (row, &(id, position)) in rows.iter().enumerate() {
            let Some(index) = self.scheduler.running.iter().position(|seq| seq.id == id) else { continue };
            let seq = &self.scheduler.running[index];
            if seq.finish.is_some() || discarded.contains(&id) || !seq.awaits_position(position) {
                continue;
            }
            #[cfg(feature = "fault-injection")]
            let panics = {
                let rid = seq.request.rid.clone();
                self.take_fault(|fault| *fault == Fault::PanicWhileSampling(rid.clone()))
            };
            #[cfg(not(feature = "fault-injection"))]
            let panics = false;
            let seq = &mut self.scheduler.running[index];
            seq.computed = position + 1;
            if self.prefix_cache
                && let Some(table) = seq.table.as_mut()
            {
                self.cache.cache_prefix(table, &seq.tokens[..seq.computed]);
            }
            match draws.draw(&self.tokenizer, seq, row, panics).await {
                Ok(()) => generated += 1,
                Err(error) => seq.fail(error),
            }
            let fed_next = words[row * DEPTH.words_per_row()];
            if seq.tokens.last() != Some(&fed_next)
                && let Some(next) = next.as_deref_mut()
            {
                next.discarded.push(id);
            }
        }
        Ok(generated)
    }
}
