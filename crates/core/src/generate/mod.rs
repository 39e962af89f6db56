//! One sequence at a time, for tools and tests: a prompt's prefill, batched decode steps over
//! given tokens, and scoring a text (perplexity). The batched, streaming engine makes the same
//! model calls.

use serde::Serialize;

use crate::gpu::Tensor;
use crate::kv::{KvBlockTable, KvCache};
use crate::model::{LogitRows, Model, SequenceChunk};
use crate::sample::log_softmax;
use crate::{Error, Result};

/// Tokens of a prompt processed in one forward pass: bounds the activations' memory and keeps
/// each submission short.
pub const PREFILL_CHUNK_TOKENS: usize = 256;

/// Runs `prompt` (at least one token, its positions already reserved in `table` from 0) through
/// the model in passes of [`PREFILL_CHUNK_TOKENS`]; returns the logits `[1, vocab]` of its last
/// token.
pub fn prefill(model: &Model, cache: &KvCache, table: &KvBlockTable, prompt: &[u32]) -> Result<Tensor> {
    let mut logits = None;
    for (index, tokens) in prompt.chunks(PREFILL_CHUNK_TOKENS).enumerate() {
        let first_position = index * PREFILL_CHUNK_TOKENS;
        let last = first_position + tokens.len() == prompt.len();
        let rows = if last { LogitRows::Last } else { LogitRows::None };
        logits =
            Some(model.forward(cache, &[SequenceChunk { table, tokens, first_position, logits: rows }])?);
    }
    logits
        .ok_or_else(|| Error::InvalidParameter { field: "prompt", reason: "the prompt has no tokens".into() })
}

/// One decode step of a batch: reserves the next position of every sequence in `tables`, feeds
/// `tokens[i]` to sequence `i` in one forward pass, and returns the logits `[n, vocab]`.
pub fn decode_step(
    model: &Model,
    cache: &mut KvCache,
    tables: &mut [KvBlockTable],
    tokens: &[u32],
) -> Result<Tensor> {
    if tables.len() != tokens.len() {
        return Err(Error::InvalidBatch(format!("{} sequences but {} tokens", tables.len(), tokens.len())));
    }
    let mut positions = Vec::with_capacity(tables.len());
    for table in tables.iter_mut() {
        positions.push(cache.append(table, 1)?.start);
    }
    let chunks: Vec<SequenceChunk<'_>> = tables
        .iter()
        .zip(tokens)
        .zip(positions)
        .map(|((table, token), first_position)| SequenceChunk {
            table,
            tokens: std::slice::from_ref(token),
            first_position,
            logits: LogitRows::Last,
        })
        .collect();
    model.forward(cache, &chunks)
}

/// The result of [`perplexity`].
#[derive(Clone, Debug, Serialize)]
pub struct Perplexity {
    /// exp of the mean negative log-likelihood.
    pub ppl: f64,
    /// Tokens whose likelihood was scored.
    pub scored_tokens: usize,
    /// Windows evaluated.
    pub windows: usize,
    /// Tokens per window.
    pub ctx: usize,
}

/// Perplexity as llama.cpp's reference defines it: consecutive windows of `ctx` tokens of
/// `ids`, at most `max_windows` of them, each from an empty cache; the mean negative
/// log-likelihood of every token of a window but its first; exp of that mean.
/// `on_window(done, total)` reports progress.
pub async fn perplexity(
    model: &Model,
    ids: &[u32],
    ctx: usize,
    max_windows: usize,
    on_window: &mut dyn FnMut(usize, usize),
) -> Result<Perplexity> {
    let context = model.config().context_length;
    if ctx < 2 || ctx > context {
        return Err(Error::InvalidParameter {
            field: "ctx",
            reason: format!("{ctx} must be at least 2 and at most the model's context of {context} tokens"),
        });
    }
    let windows = (ids.len() / ctx).min(max_windows);
    if windows == 0 {
        return Err(Error::InvalidParameter {
            field: "ctx",
            reason: format!("the text has {} tokens, fewer than one window of {ctx}", ids.len()),
        });
    }
    check_prompt(model, &ids[..windows * ctx])?;
    let mut cache = model.new_kv_cache(Some(ctx))?;
    // Logits of a pass must fit one binding: split a window into passes of at most that many rows.
    let rows_per_pass = model.max_logit_rows().clamp(1, PREFILL_CHUNK_TOKENS);
    let mut nll = 0.0f64;
    let mut scored = 0usize;
    for (window_index, window) in ids.chunks_exact(ctx).take(windows).enumerate() {
        let mut table = cache.new_sequence();
        cache.append(&mut table, ctx)?;
        for (pass, tokens) in window.chunks(rows_per_pass).enumerate() {
            let first = pass * rows_per_pass;
            let chunk =
                SequenceChunk { table: &table, tokens, first_position: first, logits: LogitRows::All };
            let logits = model.forward(&cache, &[chunk])?.to_f32(model.gpu()).await?;
            for (offset, row) in logits.chunks_exact(model.config().vocab_size).enumerate() {
                if let Some(&next) = window.get(first + offset + 1) {
                    nll -= log_softmax(row)[next as usize];
                    scored += 1;
                }
            }
        }
        cache.release(table);
        on_window(window_index + 1, windows);
    }
    Ok(Perplexity { ppl: (nll / scored as f64).exp(), scored_tokens: scored, windows, ctx })
}

fn check_prompt(model: &Model, ids: &[u32]) -> Result<()> {
    let vocab = model.config().vocab_size;
    if ids.is_empty() {
        return Err(Error::InvalidParameter { field: "prompt", reason: "the prompt has no tokens".into() });
    }
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::TokenOutOfVocabulary { id: bad, vocab_size: vocab });
    }
    let context = model.config().context_length;
    if ids.len() > context {
        return Err(Error::InvalidParameter {
            field: "prompt",
            reason: format!(
                "the prompt has {} tokens, more than the model's context of {context}",
                ids.len()
            ),
        });
    }
    Ok(())
}
