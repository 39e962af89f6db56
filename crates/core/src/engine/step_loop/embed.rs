//! Embeddings: each input's prompt run through the model in passes of the step's token budget,
//! its final hidden states (after the output norm) pooled as the model's `pooling_type` says
//! and scaled to unit length. A job runs between steps, in the KV blocks it needs for the time
//! of its passes, and gives them back when done (they are never cached).

use std::panic::AssertUnwindSafe;

use futures::FutureExt;

use super::StepLoop;
use crate::engine::Embeddings;
use crate::error::panic_message;
use crate::kv::KvBlockTable;
use crate::model::{LogitRows, Pooling, SequenceChunk};
use crate::{Error, Result};

impl StepLoop {
    /// Runs the embedding jobs waiting, in order. A job that finds too few free KV blocks waits
    /// while sequences run (they free blocks as they end), and fails when nothing does.
    pub(super) async fn run_embeddings(&mut self) {
        while let Some(job) = self.embed_jobs.front() {
            if job.reply.is_canceled() {
                self.embed_jobs.pop_front();
                continue;
            }
            let inputs = job.inputs.clone();
            let outcome = AssertUnwindSafe(self.embed(&inputs)).catch_unwind().await;
            let result = match outcome {
                Ok(Err(Error::KvCacheFull { .. })) if !self.scheduler.is_idle() => return,
                Ok(result) => result,
                Err(payload) => Err(Error::StepFailed(format!(
                    "an embedding pass panicked: {}",
                    panic_message(&*payload)
                ))),
            };
            if let Err(error @ (Error::Gpu(_) | Error::Readback(_))) = &result {
                self.health.fail(format!("an embedding pass failed on the GPU: {error}"));
            }
            if let Some(job) = self.embed_jobs.pop_front() {
                let _ = job.reply.send(result);
            }
        }
    }

    /// The embeddings of `inputs`, each in its own blocks, given back whatever happens.
    async fn embed(&mut self, inputs: &[Vec<u32>]) -> Result<Embeddings> {
        let mut vectors = Vec::with_capacity(inputs.len());
        for input in inputs {
            let mut table = self.cache.new_sequence();
            let vector = self.embed_one(&mut table, input).await;
            self.cache.release(table);
            vectors.push(vector?);
        }
        Ok(Embeddings { vectors, prompt_tokens: inputs.iter().map(Vec::len).sum() })
    }

    /// One input's embedding, its positions reserved in `table`.
    async fn embed_one(&mut self, table: &mut KvBlockTable, input: &[u32]) -> Result<Vec<f32>> {
        self.cache.append(table, input.len())?;
        let pooling = self.model.config().pooling;
        let width = self.model.config().hidden;
        let budget = self.scheduler.token_budget().max(1);
        let ctx = self.model.gpu().clone();
        let mut sum = vec![0f64; width];
        for start in (0..input.len()).step_by(budget) {
            let end = (start + budget).min(input.len());
            let rows = match pooling {
                Pooling::Mean => LogitRows::All,
                Pooling::First if start == 0 => LogitRows::All,
                Pooling::Last if end == input.len() => LogitRows::Last,
                Pooling::First | Pooling::Last => LogitRows::None,
            };
            let chunk =
                SequenceChunk { table, tokens: &input[start..end], first_position: start, logits: rows };
            let hidden = self.model.forward_hidden(&self.cache, &[chunk])?;
            if rows == LogitRows::None {
                continue;
            }
            let states = hidden.to_f32(&ctx).await?;
            let pooled_rows = match pooling {
                Pooling::First => &states[..width],
                Pooling::Mean | Pooling::Last => &states[..],
            };
            for row in pooled_rows.chunks_exact(width) {
                for (total, &value) in sum.iter_mut().zip(row) {
                    *total += f64::from(value);
                }
            }
        }
        if pooling == Pooling::Mean {
            let count = input.len() as f64;
            sum.iter_mut().for_each(|total| *total /= count);
        }
        let norm = sum.iter().map(|value| value * value).sum::<f64>().sqrt();
        let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        Ok(sum.iter().map(|value| (value * scale) as f32).collect())
    }
}
