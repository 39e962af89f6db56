//! Which sequences step next, and with how many tokens: continuous batching with chunked
//! prefill under a token budget, first come first served, and preemption by recompute when the
//! KV cache runs out.
//!
//! Every step, in this order:
//! 1. each running sequence that is decoding gets its one token (they never wait for a prompt);
//! 2. running sequences still in their prompt get chunks of it from what is left of the budget;
//! 3. waiting sequences are admitted, oldest first, while there is budget and room in the
//!    running set: each starts with the longest prefix the prefix cache holds (further samples
//!    of one prompt wait until the first has computed it, then share its blocks).
//!
//! Positions are reserved in the KV cache as chunks are planned. When it is full, the sequence
//! admitted last is preempted: its blocks go back (full ones stay in the prefix cache) and it
//! waits at the head of the queue, to be recomputed from its tokens when there is room, with
//! its sampler state intact so its output does not change.

use std::collections::VecDeque;
use std::ops::Range;

use crate::engine::sequence::Sequence;
use crate::kv::KvCache;
use crate::model::LogitRows;

/// The scheduler's limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Sequences in the running batch at most.
    pub max_running: usize,
    /// Tokens per forward pass at most (decode tokens and prompt chunks together).
    pub token_budget: usize,
    /// Rows of logits one forward pass may return.
    pub max_logit_rows: usize,
    /// Whether admissions look up the prefix cache.
    pub prefix_cache: bool,
    /// Whether decode steps of greedy sequences overlap (`step_loop/overlap.rs`).
    pub overlap_steps: bool,
}

/// One sequence's share of a step.
#[derive(Clone, Debug)]
pub(crate) struct Planned {
    /// Index into [`Scheduler::running`].
    pub seq: usize,
    /// Positions of the sequence's tokens fed this step.
    pub positions: Range<usize>,
    pub logits: LogitRows,
}

impl Planned {
    /// Rows of logits this chunk gets.
    pub fn rows(&self) -> usize {
        match self.logits {
            LogitRows::None => 0,
            LogitRows::Last => 1,
            LogitRows::All => self.positions.len(),
        }
    }
}

/// Running totals of what the scheduler did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SchedulerStats {
    /// Prompt tokens of sequences admitted for the first time.
    pub prompt_tokens: u64,
    /// Of those, tokens found in the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Sequences preempted because the KV cache was full.
    pub preemptions: u64,
}

/// The waiting queue and the running batch.
pub(crate) struct Scheduler {
    limits: Limits,
    pub stats: SchedulerStats,
    /// Sequences waiting for admission (or readmission after preemption), in order.
    pub waiting: VecDeque<Sequence>,
    /// The running batch, in order of admission.
    pub running: Vec<Sequence>,
}

/// A chunk being planned, by sequence id (indices shift when a sequence is preempted).
struct Draft {
    id: u64,
    positions: Range<usize>,
    logits: LogitRows,
}

impl Scheduler {
    pub fn new(limits: Limits) -> Self {
        Scheduler { limits, stats: SchedulerStats::default(), waiting: VecDeque::new(), running: Vec::new() }
    }

    /// Whether admissions look up the prefix cache (and finished prompts go into it).
    pub fn prefix_cache(&self) -> bool {
        self.limits.prefix_cache
    }

    /// The most tokens one forward pass takes.
    pub fn token_budget(&self) -> usize {
        self.limits.token_budget
    }

    /// Whether decode steps of greedy sequences may overlap.
    pub fn overlaps_steps(&self) -> bool {
        self.limits.overlap_steps
    }

    /// True when a sequence waits and the running batch has room for it: the next step should
    /// be planned here, to admit it.
    pub fn would_admit(&self) -> bool {
        !self.waiting.is_empty() && self.running.len() < self.limits.max_running
    }

    /// True when no sequence waits or runs.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Plans the next step (see the module documentation), reserving its positions in `cache`.
    /// Returns the chunks in the order the forward pass takes them; empty when nothing can run.
    pub fn schedule(&mut self, cache: &mut KvCache) -> Vec<Planned> {
        let mut budget = Budget { tokens: self.limits.token_budget, rows: self.limits.max_logit_rows };
        let mut drafts: Vec<Draft> = Vec::new();
        for decoding in [true, false] {
            let mut i = 0;
            while i < self.running.len() {
                let seq = &self.running[i];
                let is_decoding = seq.tokens.len() - seq.computed == 1;
                if is_decoding != decoding || drafts.iter().any(|d| d.id == seq.id) {
                    i += 1;
                    continue;
                }
                let Some(draft) = draft_chunk(seq, &budget) else {
                    i += 1;
                    continue;
                };
                let Some(table) = self.running[i].table.as_mut() else {
                    i += 1;
                    continue;
                };
                let missing = draft.positions.end.saturating_sub(table.tokens());
                if cache.append(table, missing).is_ok() {
                    budget.take(&draft);
                    drafts.push(draft);
                    i += 1;
                    continue;
                }
                // The cache is full: preempt the last admitted sequence not planned yet, or
                // this one when every other is planned (it waits for the next steps).
                let victim = (0..self.running.len())
                    .rev()
                    .find(|&j| j != i && !drafts.iter().any(|d| d.id == self.running[j].id));
                match victim {
                    Some(j) => {
                        self.preempt(cache, j);
                        if j < i {
                            i -= 1;
                        }
                    }
                    None => {
                        self.preempt(cache, i);
                    }
                }
            }
        }
        while self.running.len() < self.limits.max_running && budget.tokens > 0 {
            if self.waiting.front().is_some_and(|seq| self.waits_for_leader(seq)) {
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else { break };
            let mut table = if self.limits.prefix_cache {
                cache.match_prefix(&seq.tokens, seq.max_cached_tokens())
            } else {
                cache.new_sequence()
            };
            seq.computed = table.tokens();
            let first_admission = seq.cached_tokens.is_none();
            let admitted = draft_chunk(&seq, &budget).filter(|draft| {
                let missing = draft.positions.end - table.tokens();
                cache.append(&mut table, missing).is_ok()
            });
            match admitted {
                Some(draft) => {
                    if first_admission {
                        let cached = seq.computed.min(seq.prompt_len);
                        seq.cached_tokens = Some(cached);
                        self.stats.prompt_tokens += seq.prompt_len as u64;
                        self.stats.cached_prompt_tokens += cached as u64;
                    }
                    budget.take(&draft);
                    drafts.push(draft);
                    seq.table = Some(table);
                    self.running.push(seq);
                }
                None => {
                    // No room yet: wait at the head of the queue, holding nothing.
                    cache.release(table);
                    seq.computed = 0;
                    self.waiting.push_front(seq);
                    break;
                }
            }
        }
        let mut planned: Vec<Planned> = drafts
            .into_iter()
            .filter_map(|d| {
                let seq = self.running.iter().position(|s| s.id == d.id)?;
                Some(Planned { seq, positions: d.positions, logits: d.logits })
            })
            .collect();
        planned.sort_by_key(|p| p.seq);
        planned
    }

    /// True when `seq` is a further sample of a prompt whose first sample has not computed the
    /// prompt yet: admitted after it, `seq` finds the prompt's full blocks in the prefix cache
    /// instead of computing them a second time.
    fn waits_for_leader(&self, seq: &Sequence) -> bool {
        let Some(leader) = seq.prompt_leader.filter(|_| self.limits.prefix_cache) else { return false };
        self.waiting.iter().any(|s| s.id == leader)
            || self.running.iter().any(|s| s.id == leader && s.computed < s.prompt_len)
    }

    /// Takes running sequence `index` out of the batch: its blocks go back and it waits at the
    /// head of the queue to be recomputed.
    pub fn preempt(&mut self, cache: &mut KvCache, index: usize) {
        self.stats.preemptions += 1;
        let mut seq = self.running.remove(index);
        if let Some(table) = seq.table.take() {
            cache.release(table);
        }
        seq.reset_for_recompute();
        self.waiting.push_front(seq);
    }
}

/// What is left of a step's budget.
struct Budget {
    tokens: usize,
    rows: usize,
}

impl Budget {
    fn take(&mut self, draft: &Draft) {
        self.tokens -= draft.positions.len();
        self.rows -= match draft.logits {
            LogitRows::None => 0,
            LogitRows::Last => 1,
            LogitRows::All => draft.positions.len(),
        };
    }
}

/// The next chunk of `seq` that fits `budget`: as many of its uncomputed tokens as the budget
/// allows; logits for its last token when the chunk reaches the end, for every token while
/// prompt log-probabilities are owed.
fn draft_chunk(seq: &Sequence, budget: &Budget) -> Option<Draft> {
    let remaining = seq.tokens.len() - seq.computed;
    let all_rows = seq.wants_input_logprobs() && seq.computed < seq.prompt_len;
    let mut take = remaining.min(budget.tokens);
    if all_rows {
        take = take.min(budget.rows);
    }
    let reaches_end = take == remaining;
    let logits = match (all_rows, reaches_end) {
        (true, _) => LogitRows::All,
        (false, true) => LogitRows::Last,
        (false, false) => LogitRows::None,
    };
    if take == 0 || (logits == LogitRows::Last && budget.rows == 0) {
        return None;
    }
    Some(Draft { id: seq.id, positions: seq.computed..seq.computed + take, logits })
}
