//! The input of one forward pass, checked and uploaded: which tokens, at which positions, in
//! which cache slots, attending to which blocks, and which rows need logits.

use std::ops::Range;

use crate::gpu::{Encoder, GpuContext, QuantMatrix, Tensor};
use crate::kernels::attention::{
    self, AttentionOptions, DecodeBatch, HeadTransform, KvCacheLayer, PrefillBatch, Projections,
};
use crate::kernels::matmul::{MatmulInput, MatmulOutput, matmul};
use crate::kernels::norm::{RmsNorm, rms_norm_in_place};
use crate::kv::{KvBlockTable, KvCache};
use crate::{Error, Result};

/// Which of a chunk's tokens get a row of logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// None: a chunk of a prompt whose next token is not wanted yet (chunked prefill).
    None,
    /// The last token only: the next token of a prompt or of a decode step.
    Last,
    /// Every token: prompt log-probabilities, perplexity.
    All,
}

/// Consecutive tokens of one sequence, processed in one forward pass.
///
/// Their positions are `first_position ..`, and the sequence's block table must have reserved
/// them already ([`KvCache::append`]); every earlier position must hold the keys and values of
/// an earlier forward pass (or of an earlier chunk of this batch).
#[derive(Clone, Copy, Debug)]
pub struct SequenceChunk<'a> {
    /// The sequence's blocks in the KV cache.
    pub table: &'a KvBlockTable,
    /// Token ids, each below the vocabulary size; at least one.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in the sequence.
    pub first_position: usize,
    /// Which tokens get logits.
    pub logits: LogitRows,
}

/// Token ids that a pass takes from the GPU instead of from its chunks: tokens an earlier pass
/// sampled there and the host has not read back yet. Each `(token, offset)` replaces the
/// batch's token `token` (counted over every chunk's tokens, in order) with the u32 at byte
/// `offset` of `source`; the chunk holds any valid id in its place.
#[derive(Clone, Copy)]
pub struct GpuTokens<'a> {
    /// The buffer the ids are in.
    pub source: &'a Tensor,
    /// Which tokens of the batch, and where each id is in `source`.
    pub tokens: &'a [(usize, u64)],
}

/// The attention inputs of a step: the decode kernel when every chunk is one token, the
/// prefill kernel otherwise.
enum StepAttention {
    Decode {
        context_lens: Tensor,
        block_table: Tensor,
    },
    Prefill {
        seq_ids: Tensor,
        /// u32 `[n_tokens]`: each token's position in its sequence.
        positions: Tensor,
        /// u32 `[n_tokens]`: each token's slot in the KV cache.
        slots: Tensor,
        block_table: Tensor,
    },
}

/// A batch on the GPU: the per-token inputs every layer shares.
pub(crate) struct Step {
    /// u32 `[n_tokens]`.
    pub token_ids: Tensor,
    attention: StepAttention,
    /// Runs of consecutive rows that get logits.
    logit_runs: Vec<Range<usize>>,
    n_logit_rows: usize,
    /// The head stops at the normalised hidden states: embeddings, not logits.
    hidden_output: bool,
}

impl Step {
    /// Checks `chunks` against the vocabulary and `cache`, and uploads their inputs.
    pub fn new(
        ctx: &GpuContext,
        vocab_size: usize,
        cache: &KvCache,
        chunks: &[SequenceChunk<'_>],
    ) -> Result<Self> {
        if chunks.is_empty() {
            return Err(Error::InvalidBatch("the batch has no sequences".into()));
        }
        let block_size = cache.block_size_tokens();
        let (mut token_ids, mut positions, mut slots, mut seq_ids) = (vec![], vec![], vec![], vec![]);
        let mut logit_runs: Vec<Range<usize>> = Vec::new();
        let mut max_blocks = 1;
        for (index, chunk) in chunks.iter().enumerate() {
            let invalid =
                |reason: String| Error::InvalidBatch(format!("sequence {index} of the batch: {reason}"));
            if chunk.tokens.is_empty() {
                return Err(invalid("has no tokens".into()));
            }
            if chunk.table.block_size_tokens() != block_size
                || chunk.table.blocks().iter().any(|&b| b as usize >= cache.num_blocks())
            {
                return Err(invalid("its block table belongs to another KV cache".into()));
            }
            if let Some(&bad) = chunk.tokens.iter().find(|&&t| t as usize >= vocab_size) {
                return Err(invalid(format!(
                    "token id {bad} is outside the vocabulary of {vocab_size} tokens"
                )));
            }
            let end = chunk.first_position + chunk.tokens.len();
            if end > chunk.table.tokens() {
                return Err(invalid(format!(
                    "positions {}..{end} are not all reserved in its block table ({} are): append them to the \
                     KV cache first",
                    chunk.first_position,
                    chunk.table.tokens()
                )));
            }
            max_blocks = max_blocks.max(end.div_ceil(block_size));
            let first_row = token_ids.len();
            for (offset, &token) in chunk.tokens.iter().enumerate() {
                let position = chunk.first_position + offset;
                // Reserved, so the slot exists; positions fit u32 because slots do.
                let slot =
                    chunk.table.slot(position).ok_or_else(|| invalid(format!("position {position}")))?;
                token_ids.push(token);
                positions.push(position as u32);
                slots.push(slot);
                seq_ids.push(index as u32);
            }
            let rows = match chunk.logits {
                LogitRows::None => None,
                LogitRows::Last => Some(token_ids.len() - 1..token_ids.len()),
                LogitRows::All => Some(first_row..token_ids.len()),
            };
            match (rows, logit_runs.last_mut()) {
                (Some(rows), Some(last)) if last.end == rows.start => last.end = rows.end,
                (Some(rows), _) => logit_runs.push(rows),
                (None, _) => {}
            }
        }
        // One row of block ids per chunk, padded with block 0 (never read: the kernels stop at
        // each row's own positions) to a power of two: the table's shape, and with it the bind
        // groups that name it, then change at doublings, not at every block a sequence grows by.
        let max_blocks = max_blocks.next_power_of_two();
        let mut block_table = vec![0u32; chunks.len() * max_blocks];
        for (row, chunk) in block_table.chunks_exact_mut(max_blocks).zip(chunks) {
            let used = (chunk.first_position + chunk.tokens.len()).div_ceil(block_size);
            row[..used].copy_from_slice(&chunk.table.blocks()[..used]);
        }
        let n_tokens = token_ids.len();
        let block_table = Tensor::from_slice(ctx, "block table", &[chunks.len(), max_blocks], &block_table)?;
        let attention = if n_tokens == chunks.len() {
            let context_lens: Vec<u32> = positions.iter().map(|p| p + 1).collect();
            StepAttention::Decode {
                context_lens: Tensor::from_slice(ctx, "context lengths", &[n_tokens], &context_lens)?,
                block_table,
            }
        } else {
            StepAttention::Prefill {
                seq_ids: Tensor::from_slice(ctx, "sequence ids", &[n_tokens], &seq_ids)?,
                positions: Tensor::from_slice(ctx, "positions", &[n_tokens], &positions)?,
                slots: Tensor::from_slice(ctx, "kv slots", &[n_tokens], &slots)?,
                block_table,
            }
        };
        Ok(Step {
            token_ids: Tensor::from_slice(ctx, "token ids", &[n_tokens], &token_ids)?,
            attention,
            n_logit_rows: logit_runs.iter().map(ExactSizeIterator::len).sum(),
            logit_runs,
            hidden_output: false,
        })
    }

    /// Records the copies that overwrite the token ids `gpu_tokens` names: ahead of every
    /// command that reads them, after the upload of the chunks' ids (queue order).
    pub fn take_gpu_tokens(&self, encoder: &mut Encoder, gpu_tokens: &GpuTokens<'_>) -> Result<()> {
        for &(token, offset) in gpu_tokens.tokens {
            if token >= self.n_tokens()
                || offset + 4 > (gpu_tokens.source.len() * 4) as u64
                || offset % 4 != 0
            {
                return Err(Error::InvalidBatch(format!(
                    "token {token} of a batch of {} cannot come from byte {offset} of a tensor of {} words",
                    self.n_tokens(),
                    gpu_tokens.source.len()
                )));
            }
            encoder.copy_buffer_to_buffer(
                gpu_tokens.source.buffer(),
                offset,
                self.token_ids.buffer(),
                token as u64 * 4,
                4,
            );
        }
        Ok(())
    }

    /// Tokens in the batch.
    pub fn n_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Records causal self-attention of the step's tokens, given their projections `new`
    /// (`[n_tokens, heads * head_dim]` each): `heads` normalises and rotates their queries and
    /// keys, their keys and values go to their slots in `cache`, and each query attends to its
    /// sequence's keys up to its own; the result goes to `out` (`new.q`'s shape). A step of one
    /// new token per sequence does all of it in one pass; otherwise the queries and keys are
    /// transformed in place first.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        heads: &HeadTransform,
        new: &Projections<'_>,
        cache: &KvCacheLayer<'_>,
        options: &AttentionOptions,
        out: &Tensor,
    ) -> Result<()> {
        match &self.attention {
            StepAttention::Decode { context_lens, block_table } => {
                let batch = DecodeBatch { context_lens, block_table };
                attention::decode(ctx, encoder, heads, new, cache, &batch, options, out)
            }
            StepAttention::Prefill { seq_ids, positions, slots, block_table } => {
                heads.apply_and_store(ctx, encoder, new, positions, cache, slots)?;
                let batch = PrefillBatch { seq_ids, positions, block_table };
                attention::prefill(ctx, encoder, new.q, cache, &batch, options, out)
            }
        }
    }

    /// This step's head ends at the normalised hidden states ([`Step::logits`]).
    pub fn with_hidden_output(mut self) -> Self {
        self.hidden_output = true;
        self
    }

    /// Records the model's head on the rows that need logits: those rows of the final hidden
    /// state `hidden` (`[n_tokens, width]`) are gathered, normalised by `output_norm`, and
    /// projected by `lm_head` into logits `[n_logit_rows, vocab]`; or, for a step with hidden
    /// output, returned as they are after the norm (`[n_logit_rows, width]`).
    pub fn logits(
        &self,
        ctx: &GpuContext,
        encoder: &mut Encoder,
        hidden: &Tensor,
        output_norm: &RmsNorm<'_>,
        lm_head: &QuantMatrix,
    ) -> Result<Tensor> {
        let width = lm_head.cols();
        let out_width = if self.hidden_output { width } else { lm_head.rows() };
        if self.n_logit_rows == 0 {
            return Tensor::empty(ctx, "logits", &[0, out_width]);
        }
        let selected = Tensor::empty(ctx, "hidden rows with logits", &[self.n_logit_rows, width])?;
        let row_bytes = (width * 4) as u64;
        let mut written = 0;
        for run in &self.logit_runs {
            let bytes = run.len() as u64 * row_bytes;
            encoder.copy_buffer_to_buffer(
                hidden.buffer(),
                run.start as u64 * row_bytes,
                selected.buffer(),
                written,
                bytes,
            );
            written += bytes;
        }
        rms_norm_in_place(ctx, encoder, output_norm, &selected)?;
        if self.hidden_output {
            return Ok(selected);
        }
        let logits = Tensor::empty(ctx, "logits", &[self.n_logit_rows, out_width])?;
        matmul(ctx, encoder, lm_head, MatmulInput::Plain(&selected), MatmulOutput::Write(&logits))?;
        Ok(logits)
    }
}
