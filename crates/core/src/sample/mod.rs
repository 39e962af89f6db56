//! Choosing the next token from a row of logits: logit bias and repetition, frequency and
//! presence penalties first, then greedy, or temperature with top-k, top-p and min-p filtering,
//! from a seeded random source so a request with a seed is reproducible whatever batch it is in.
//! A structured-output constraint (compiled by [`crate::grammar`]) removes the tokens its grammar does
//! not allow before any of that.

use std::collections::{BTreeMap, HashMap, HashSet};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::kernels::sample::MAX_CANDIDATES;
use crate::{Error, Result};

mod constraint;

pub use constraint::{AllowedTokens, OutputConstraint};

/// How to choose tokens: the request contract's sampling parameters, with the defaults and
/// valid ranges ARCHITECTURE.md gives.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Tokens to generate at most; at least 1.
    pub max_new_tokens: usize,
    /// Tokens to generate before a stop token may end the sequence (stop tokens are masked
    /// until then); at most `max_new_tokens`.
    pub min_new_tokens: usize,
    /// Softmax temperature; below 1e-6 means greedy.
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; in (0, 1].
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; -1 keeps all.
    pub top_k: i32,
    /// Drop tokens less likely than `min_p` times the most likely one; in [0, 1].
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of every token already in the prompt or
    /// the output; in (0, 2], 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated; in [-2, 2].
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit if it was generated at all; in [-2, 2].
    pub presence_penalty: f32,
    /// Strings that end the sequence when the text contains them; never part of the output.
    pub stop: Vec<String>,
    /// Tokens that end the sequence, besides the model's end-of-generation tokens.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the model's end-of-generation tokens (`stop_token_ids` still stop).
    pub ignore_eos: bool,
    /// Leave special tokens (control and user-defined) out of the output text.
    pub skip_special_tokens: bool,
    /// Seed of the random source; `None` draws one.
    pub seed: Option<u64>,
    /// Samples per prompt; sample `i` of a seeded request uses seed `seed + i`.
    pub n: usize,
    /// Added to the logit of each listed token before sampling (`-inf` bans it).
    pub logit_bias: BTreeMap<u32, f32>,
    /// The output is JSON valid against this JSON Schema document: an object or a boolean, or
    /// its JSON text. Separators are `", "` and `": "` and there is no other whitespace, unless
    /// the schema sets llguidance's `x-guidance` options. At most one of `json_schema`, `regex`
    /// and `grammar`.
    pub json_schema: Option<serde_json::Value>,
    /// The whole output matches this regular expression (Rust `regex` syntax, no look-around).
    pub regex: Option<String>,
    /// The output is a sentence of this grammar, in llguidance's Lark syntax (its `start` rule;
    /// `%json { ... }` embeds a JSON Schema).
    pub grammar: Option<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_new_tokens: 128,
            min_new_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            skip_special_tokens: true,
            seed: None,
            n: 1,
            logit_bias: BTreeMap::new(),
            json_schema: None,
            regex: None,
            grammar: None,
        }
    }
}

/// Temperatures below this are greedy decoding.
const GREEDY_BELOW: f32 = 1e-6;

/// The most samples one request may ask for.
pub const MAX_SAMPLES_PER_PROMPT: usize = 128;

impl SamplingParams {
    /// Checks every field's range for a model with `vocab_size` tokens; the error names the
    /// field and its valid range.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let invalid = |field: &'static str, value: String, range: &str| {
            Err(Error::InvalidParameter { field, reason: format!("{value} is outside {range}") })
        };
        if self.max_new_tokens == 0 {
            return invalid("max_new_tokens", "0".into(), "[1, context left)");
        }
        if self.min_new_tokens > self.max_new_tokens {
            return invalid(
                "min_new_tokens",
                self.min_new_tokens.to_string(),
                &format!("[0, max_new_tokens = {}]", self.max_new_tokens),
            );
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return invalid("temperature", self.temperature.to_string(), "[0, inf) (0 means greedy)");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("top_p", self.top_p.to_string(), "(0, 1]");
        }
        if !(self.top_k == -1 || self.top_k >= 1) {
            return invalid("top_k", self.top_k.to_string(), "-1 (off) or >= 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid("min_p", self.min_p.to_string(), "[0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0) {
            return invalid("repetition_penalty", self.repetition_penalty.to_string(), "(0, 2] (1 is off)");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return invalid("frequency_penalty", self.frequency_penalty.to_string(), "[-2, 2]");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return invalid("presence_penalty", self.presence_penalty.to_string(), "[-2, 2]");
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(Error::InvalidParameter { field: "stop", reason: "a stop string is empty".into() });
        }
        if let Some(&id) = self.stop_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return invalid("stop_token_ids", id.to_string(), &format!("the vocabulary [0, {vocab_size})"));
        }
        if !(1..=MAX_SAMPLES_PER_PROMPT).contains(&self.n) {
            return invalid("n", self.n.to_string(), &format!("[1, {MAX_SAMPLES_PER_PROMPT}]"));
        }
        for (&id, &bias) in &self.logit_bias {
            if id as usize >= vocab_size {
                return invalid(
                    "logit_bias",
                    format!("token {id}"),
                    &format!("the vocabulary [0, {vocab_size})"),
                );
            }
            if bias.is_nan() || bias == f32::INFINITY {
                return invalid(
                    "logit_bias",
                    format!("{bias} for token {id}"),
                    "finite values or -inf (a ban)",
                );
            }
        }
        self.output_constraint()?;
        Ok(())
    }

    /// True when these parameters choose the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW || self.top_k == 1
    }

    /// True when the logits row is used as it is: no bias, no penalty.
    fn leaves_logits_alone(&self) -> bool {
        self.logit_bias.is_empty()
            && self.repetition_penalty == 1.0
            && self.frequency_penalty == 0.0
            && self.presence_penalty == 0.0
    }
}

/// Draws tokens for one sequence, and remembers what it drew for the penalties.
pub struct Sampler {
    params: SamplingParams,
    rng: SmallRng,
    /// Tokens that end the sequence: `stop_token_ids` and, unless `ignore_eos`, the model's.
    stop_tokens: Vec<u32>,
    /// Times each token was generated (frequency and presence penalties).
    generated_counts: HashMap<u32, u32>,
    /// Tokens of the prompt and the output (repetition penalty); empty when that is off.
    seen: HashSet<u32>,
    generated: usize,
    /// Scratch: the row after bias and penalties.
    adjusted: Vec<f32>,
    /// Scratch: (token, weight) of the candidates still in play.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for `params` (validated here against `vocab_size`), continuing `prompt`, for a
    /// model whose end-of-generation tokens are `end_tokens`. Without a seed, `fallback_seed` is
    /// used: the host supplies entropy, since the core has no OS randomness of its own on the web.
    pub fn new(
        params: SamplingParams,
        fallback_seed: u64,
        vocab_size: usize,
        prompt: &[u32],
        end_tokens: &[u32],
    ) -> Result<Self> {
        params.validate(vocab_size)?;
        let rng = SmallRng::seed_from_u64(params.seed.unwrap_or(fallback_seed));
        let mut stop_tokens = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_tokens.extend_from_slice(end_tokens);
        }
        stop_tokens.sort_unstable();
        stop_tokens.dedup();
        let seen =
            if params.repetition_penalty == 1.0 { HashSet::new() } else { prompt.iter().copied().collect() };
        Ok(Sampler {
            params,
            rng,
            stop_tokens,
            generated_counts: HashMap::new(),
            seen,
            generated: 0,
            adjusted: Vec::new(),
            candidates: Vec::new(),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether `token` ends the sequence.
    pub fn is_stop_token(&self, token: u32) -> bool {
        self.stop_tokens.binary_search(&token).is_ok()
    }

    /// Chooses the next token from `logits` (one row over the vocabulary) and records it for
    /// the penalties. NaN logits are never chosen; a row with no finite logit left (after bias
    /// and the masking of stop tokens before `min_new_tokens`) is an error.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        self.sample_allowed(logits, None)
    }

    /// [`Sampler::sample`] among the tokens `allowed` only (all of them when `None`): the
    /// others' logits are -inf before bias and penalties. An error when none of the allowed
    /// tokens is left.
    pub fn sample_allowed(&mut self, logits: &[f32], allowed: Option<AllowedTokens<'_>>) -> Result<u32> {
        let masks_stops = self.masks_stops();
        let row = if self.params.leaves_logits_alone() && !masks_stops && allowed.is_none() {
            logits
        } else {
            self.adjust(logits, masks_stops, allowed);
            &self.adjusted
        };
        let token = choose(&self.params, &mut self.rng, &mut self.candidates, row).map_err(|error| {
            if allowed.is_some() {
                Error::Constraint(
                    "no token the output's grammar allows is left to draw (logit_bias bans them, or they \
                     end the output before min_new_tokens)"
                        .into(),
                )
            } else {
                error
            }
        })?;
        self.record(token);
        Ok(token)
    }

    /// How many of a row's most likely tokens decide the next draw, when a few do: 1 for greedy
    /// decoding, `top_k` for top-k sampling up to [`MAX_CANDIDATES`] tokens. `None` when the
    /// draw needs the whole row: sampling from every token, or logits that bias, penalties or
    /// the masking of stop tokens change first.
    pub fn candidates_needed(&self) -> Option<usize> {
        if !self.params.leaves_logits_alone() || self.masks_stops() {
            return None;
        }
        if self.params.is_greedy() {
            return Some(1);
        }
        usize::try_from(self.params.top_k).ok().filter(|&k| (1..=MAX_CANDIDATES).contains(&k))
    }

    /// Chooses the next token from a row's most likely tokens, as [`Sampler::sample`] would
    /// from the whole row: `candidates` are (token, logit) sorted by logit, largest first, ties
    /// by smaller id, and every token of the row whose logit is above `let_go` is among them
    /// (what [`crate::kernels::sample::top_candidates`] finds on the GPU). The same seed draws
    /// the same token either way. `None`, with nothing drawn or recorded, when they do not
    /// decide the draw exactly: the caller samples from the whole row instead.
    pub fn sample_candidates(&mut self, candidates: &[(u32, f32)], let_go: f32) -> Option<u32> {
        self.sample_candidates_allowed(candidates, let_go, None)
    }

    /// [`Sampler::sample_candidates`] among the tokens `allowed` only, as
    /// [`Sampler::sample_allowed`] would draw from the whole row. The candidates stay exact: the
    /// allowed ones are every allowed token above `let_go`, and a token not allowed is -inf.
    pub fn sample_candidates_allowed(
        &mut self,
        candidates: &[(u32, f32)],
        let_go: f32,
        allowed: Option<AllowedTokens<'_>>,
    ) -> Option<u32> {
        self.candidates_needed()?;
        let known = candidates.iter().take_while(|(_, logit)| *logit > let_go).count();
        let kept: Vec<(u32, f32)>;
        let above = match allowed {
            None => &candidates[..known],
            Some(allowed) => {
                kept =
                    candidates[..known].iter().filter(|(token, _)| allowed.allows(*token)).copied().collect();
                &kept
            }
        };
        let token = choose_among(&self.params, &mut self.rng, &mut self.candidates, above, let_go)?;
        self.record(token);
        Some(token)
    }

    /// Stop tokens are masked until `min_new_tokens` tokens are generated.
    fn masks_stops(&self) -> bool {
        self.generated < self.params.min_new_tokens && !self.stop_tokens.is_empty()
    }

    /// Counts a drawn token for the penalties.
    fn record(&mut self, token: u32) {
        self.generated += 1;
        *self.generated_counts.entry(token).or_default() += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token);
        }
    }

    /// Writes `logits` with the constraint, bias, penalties and stop-token masking applied into
    /// `adjusted`.
    fn adjust(&mut self, logits: &[f32], masks_stops: bool, allowed: Option<AllowedTokens<'_>>) {
        let params = &self.params;
        self.adjusted.clear();
        self.adjusted.extend_from_slice(logits);
        let row = &mut self.adjusted;
        if let Some(allowed) = allowed {
            for (id, logit) in row.iter_mut().enumerate() {
                if !allowed.allows(id as u32) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        for (&id, &bias) in &params.logit_bias {
            if let Some(logit) = row.get_mut(id as usize) {
                *logit += bias;
            }
        }
        let penalty = params.repetition_penalty;
        for &id in &self.seen {
            if let Some(logit) = row.get_mut(id as usize) {
                *logit = if *logit > 0.0 { *logit / penalty } else { *logit * penalty };
            }
        }
        for (&id, &count) in &self.generated_counts {
            if let Some(logit) = row.get_mut(id as usize) {
                *logit -= params.frequency_penalty * count as f32 + params.presence_penalty;
            }
        }
        if masks_stops {
            for &id in &self.stop_tokens {
                if let Some(logit) = row.get_mut(id as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// Chooses a token from `row` under `params`' temperature and filters.
fn choose(
    params: &SamplingParams,
    rng: &mut SmallRng,
    candidates: &mut Vec<(u32, f32)>,
    row: &[f32],
) -> Result<u32> {
    let best = argmax(row).ok_or_else(|| Error::InvalidParameter {
        field: "logits",
        reason: "the row has no finite value".into(),
    })?;
    if params.is_greedy() {
        return Ok(best);
    }
    let max_logit = row[best as usize];
    candidates.clear();
    candidates.extend(
        row.iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, weight(params, l, max_logit))),
    );
    if params.top_k > 0 && (params.top_k as usize) < candidates.len() {
        let k = params.top_k as usize;
        candidates.select_nth_unstable_by(k - 1, by_probability);
        candidates.truncate(k);
    }
    candidates.sort_unstable_by(by_probability);
    Ok(draw(params, rng, candidates))
}

/// [`choose`] from the row's tokens above `let_go` only (`known`: every one of them, sorted by
/// logit, largest first, ties by smaller id): the same token, or `None` (drawing nothing) when
/// the tokens left out could change the choice.
fn choose_among(
    params: &SamplingParams,
    rng: &mut SmallRng,
    candidates: &mut Vec<(u32, f32)>,
    known: &[(u32, f32)],
    let_go: f32,
) -> Option<u32> {
    let &(best, max_logit) = known.first()?;
    if params.is_greedy() {
        return Some(best);
    }
    let k = usize::try_from(params.top_k).ok().filter(|&k| k >= 1 && k <= known.len())?;
    candidates.clear();
    candidates.extend(known.iter().map(|&(id, logit)| (id, weight(params, logit, max_logit))));
    candidates.sort_unstable_by(by_probability);
    // A token left out weighs at most what `let_go` weighs: the k kept must weigh more, or a
    // left-out token could tie with the last of them and win the place by its smaller id.
    if let_go > f32::NEG_INFINITY && candidates[k - 1].1 <= weight(params, let_go, max_logit) {
        return None;
    }
    candidates.truncate(k);
    Some(draw(params, rng, candidates))
}

/// A token's unnormalised probability at `params`' temperature: 1 for the most likely one.
fn weight(params: &SamplingParams, logit: f32, max_logit: f32) -> f32 {
    ((logit - max_logit) * (1.0 / params.temperature)).exp()
}

/// Most likely first; ties by id, so the order (and so a seeded draw) is deterministic.
fn by_probability(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Applies min-p and top-p to `candidates` (weights, sorted by [`by_probability`]) and draws.
fn draw(params: &SamplingParams, rng: &mut SmallRng, candidates: &mut Vec<(u32, f32)>) -> u32 {
    let total: f32 = candidates.iter().map(|c| c.1).sum();
    // min-p: relative to the most likely token, whose weight is exp(0) = 1 before scaling.
    let min_weight = params.min_p * candidates[0].1;
    let mut kept = 0;
    let mut mass = 0.0;
    for &(_, weight) in candidates.iter() {
        if kept > 0 && (weight < min_weight || mass >= params.top_p * total) {
            break;
        }
        mass += weight;
        kept += 1;
    }
    candidates.truncate(kept);
    let mut draw = rng.random::<f32>() * mass;
    for &(token, weight) in candidates.iter() {
        if draw < weight {
            return token;
        }
        draw -= weight;
    }
    candidates[kept - 1].0
}

/// Index of the largest finite value (the first one on ties), or `None` if there is none.
pub fn argmax(values: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_finite() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Natural-log softmax of one row, computed in f64: what logprob outputs and perplexity use.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln() + max;
    logits.iter().map(|&l| l as f64 - log_sum).collect()
}

/// The `n` largest entries of `logprobs` as (token, logprob), most likely first, ties by id;
/// NaN entries are skipped.
pub fn top_logprobs(logprobs: &[f64], n: usize) -> Vec<(u32, f64)> {
    if n == 0 {
        return Vec::new();
    }
    let mut entries: Vec<(u32, f64)> =
        logprobs.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l)).collect();
    let by_logprob = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if n < entries.len() {
        entries.select_nth_unstable_by(n - 1, by_logprob);
        entries.truncate(n);
    }
    entries.sort_unstable_by(by_logprob);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(params, 7, 1000, &[], &[]).unwrap()
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_skips_nan() {
        let mut s = sampler(SamplingParams { temperature: 0.0, ..Default::default() });
        assert_eq!(s.sample(&[0.5, f32::NAN, 2.0, 2.0, -1.0]).unwrap(), 2);
        let mut s = sampler(SamplingParams { top_k: 1, ..Default::default() });
        assert_eq!(s.sample(&[0.5, 3.0, 2.0]).unwrap(), 1);
        assert!(s.sample(&[f32::NAN, f32::NEG_INFINITY]).is_err());
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let params = SamplingParams { seed: Some(42), temperature: 0.8, ..Default::default() };
        let draw = |params: &SamplingParams| {
            let mut s = sampler(params.clone());
            (0..64).map(|_| s.sample(&logits).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(draw(&params), draw(&params));
        assert_ne!(draw(&params), draw(&SamplingParams { seed: Some(43), ..params.clone() }));
    }

    #[test]
    fn draws_follow_the_softmax() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1.
        let logits = [2f32.ln() * 3.0, 2f32.ln() * 2.0, 2f32.ln(), 2f32.ln()];
        let mut s = sampler(SamplingParams { seed: Some(1), ..Default::default() });
        let n = 40_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&logits).unwrap() as usize] += 1;
        }
        for (count, p) in counts.iter().zip([0.5, 0.25, 0.125, 0.125]) {
            let expected = p * n as f64;
            // 5 standard deviations of a binomial count.
            assert!((*count as f64 - expected).abs() < 5.0 * (expected * (1.0 - p)).sqrt(), "{counts:?}");
        }
    }

    #[test]
    fn filters_drop_the_tail() {
        let logits = [2f32.ln() * 3.0, 2f32.ln() * 2.0, 2f32.ln(), 2f32.ln()];
        let seen = |params: SamplingParams| {
            let mut s = sampler(SamplingParams { seed: Some(3), ..params });
            let mut seen = [false; 4];
            for _ in 0..2000 {
                seen[s.sample(&logits).unwrap() as usize] = true;
            }
            seen
        };
        assert_eq!(seen(SamplingParams { top_k: 2, ..Default::default() }), [true, true, false, false]);
        // 0.5 + 0.25 reaches top_p = 0.7: the third token is never drawn.
        assert_eq!(seen(SamplingParams { top_p: 0.7, ..Default::default() }), [true, true, false, false]);
        assert_eq!(seen(SamplingParams { top_p: 0.5, ..Default::default() }), [true, false, false, false]);
        // 0.125 / 0.5 = 0.25 < min_p = 0.3.
        assert_eq!(seen(SamplingParams { min_p: 0.3, ..Default::default() }), [true, true, false, false]);
        assert_eq!(seen(SamplingParams::default()), [true; 4]);
    }

    #[test]
    fn out_of_range_parameters_name_the_field() {
        let bad = [
            SamplingParams { temperature: -0.1, ..Default::default() },
            SamplingParams { temperature: f32::NAN, ..Default::default() },
            SamplingParams { top_p: 0.0, ..Default::default() },
            SamplingParams { top_p: 1.5, ..Default::default() },
            SamplingParams { top_k: 0, ..Default::default() },
            SamplingParams { top_k: -2, ..Default::default() },
            SamplingParams { min_p: 1.1, ..Default::default() },
            SamplingParams { max_new_tokens: 0, ..Default::default() },
            SamplingParams { min_new_tokens: 200, ..Default::default() },
            SamplingParams { repetition_penalty: 0.0, ..Default::default() },
            SamplingParams { repetition_penalty: 2.5, ..Default::default() },
            SamplingParams { frequency_penalty: 2.1, ..Default::default() },
            SamplingParams { presence_penalty: -3.0, ..Default::default() },
            SamplingParams { stop: vec![String::new()], ..Default::default() },
            SamplingParams { stop_token_ids: vec![1000], ..Default::default() },
            SamplingParams { n: 0, ..Default::default() },
            SamplingParams { logit_bias: [(1000, 1.0)].into(), ..Default::default() },
            SamplingParams { logit_bias: [(3, f32::NAN)].into(), ..Default::default() },
        ];
        let fields = [
            "temperature",
            "temperature",
            "top_p",
            "top_p",
            "top_k",
            "top_k",
            "min_p",
            "max_new_tokens",
            "min_new_tokens",
            "repetition_penalty",
            "repetition_penalty",
            "frequency_penalty",
            "presence_penalty",
            "stop",
            "stop_token_ids",
            "n",
            "logit_bias",
            "logit_bias",
        ];
        for (params, field) in bad.into_iter().zip(fields) {
            let err = Sampler::new(params, 0, 1000, &[], &[]).err().unwrap().to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn log_softmax_normalises() {
        let lp = log_softmax(&[1.0, 2.0, 3.0, f32::NEG_INFINITY]);
        let total: f64 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!((lp[2] - lp[1] - 1.0).abs() < 1e-12 && lp[3] == f64::NEG_INFINITY);
    }

    fn greedy_with(params: SamplingParams, prompt: &[u32], end_tokens: &[u32]) -> Sampler {
        Sampler::new(SamplingParams { temperature: 0.0, ..params }, 0, 1000, prompt, end_tokens).unwrap()
    }

    #[test]
    fn logit_bias_moves_and_bans_tokens() {
        let logits = [1.0, 3.0, 2.0];
        let mut s =
            greedy_with(SamplingParams { logit_bias: [(2, 1.5)].into(), ..Default::default() }, &[], &[]);
        assert_eq!(s.sample(&logits).unwrap(), 2);
        let ban = [(1, f32::NEG_INFINITY)].into();
        let mut s = greedy_with(SamplingParams { logit_bias: ban, ..Default::default() }, &[], &[]);
        assert_eq!(s.sample(&logits).unwrap(), 2);
    }

    #[test]
    fn penalties_push_away_from_repeats() {
        let logits = [2.0, 1.9, -1.0, -1.05];
        // Without a penalty token 0 wins every time.
        let mut plain = greedy_with(SamplingParams::default(), &[], &[]);
        assert_eq!((0..3).map(|_| plain.sample(&logits).unwrap()).collect::<Vec<_>>(), [0, 0, 0]);
        // Presence: token 0 loses 0.5 once it was generated; then token 1 does too.
        let mut presence =
            greedy_with(SamplingParams { presence_penalty: 0.5, ..Default::default() }, &[], &[]);
        assert_eq!((0..3).map(|_| presence.sample(&logits).unwrap()).collect::<Vec<_>>(), [0, 1, 0]);
        // Frequency: each repeat costs 0.06, so token 0 (2.0) gives way to 1 (1.9) after two.
        let mut frequency =
            greedy_with(SamplingParams { frequency_penalty: 0.06, ..Default::default() }, &[], &[]);
        assert_eq!((0..4).map(|_| frequency.sample(&logits).unwrap()).collect::<Vec<_>>(), [0, 0, 1, 0]);
        // Repetition counts the prompt: 0 is in it, 2.0 / 1.2 < 1.9; negative logits are
        // multiplied, so token 2 (in the prompt) falls below token 3 when 0 and 1 are banned.
        let params = SamplingParams {
            repetition_penalty: 1.2,
            logit_bias: [(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)].into(),
            ..Default::default()
        };
        let mut repetition = greedy_with(params, &[2], &[]);
        assert_eq!(repetition.sample(&logits).unwrap(), 3);
        let mut repetition =
            greedy_with(SamplingParams { repetition_penalty: 1.2, ..Default::default() }, &[0], &[]);
        assert_eq!(repetition.sample(&logits).unwrap(), 1);
    }

    #[test]
    fn stop_tokens_include_eos_unless_ignored_and_wait_for_min_new_tokens() {
        let s = greedy_with(SamplingParams { stop_token_ids: vec![7], ..Default::default() }, &[], &[2]);
        assert!(s.is_stop_token(7) && s.is_stop_token(2) && !s.is_stop_token(3));
        let s = greedy_with(
            SamplingParams { stop_token_ids: vec![7], ignore_eos: true, ..Default::default() },
            &[],
            &[2],
        );
        assert!(s.is_stop_token(7) && !s.is_stop_token(2));
        // EOS (2) is the most likely token, but it is masked for the first two tokens.
        let logits = [0.0, 1.0, 5.0];
        let mut s = greedy_with(SamplingParams { min_new_tokens: 2, ..Default::default() }, &[], &[2]);
        assert_eq!((0..3).map(|_| s.sample(&logits).unwrap()).collect::<Vec<_>>(), [1, 1, 2]);
    }

    /// What the GPU's candidate search gives for `row`: its `count` most likely tokens in order,
    /// and the logit of the next one as the largest let go of (-inf when none is left out).
    fn candidates_of(row: &[f32], count: usize) -> (Vec<(u32, f32)>, f32) {
        let mut sorted: Vec<(u32, f32)> =
            row.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let let_go = sorted.get(count).map_or(f32::NEG_INFINITY, |c| c.1);
        sorted.truncate(count);
        (sorted, let_go)
    }

    #[test]
    fn candidates_draw_what_the_whole_row_draws() {
        let mut rng = SmallRng::seed_from_u64(5);
        let settings = [
            SamplingParams { temperature: 0.0, ..Default::default() },
            SamplingParams { top_k: 1, ..Default::default() },
            SamplingParams { top_k: 40, ..Default::default() },
            SamplingParams { top_k: 64, temperature: 0.7, top_p: 0.9, ..Default::default() },
            SamplingParams { top_k: 20, temperature: 1.5, min_p: 0.05, ..Default::default() },
            SamplingParams { top_k: 5, temperature: 0.01, ..Default::default() },
            // So hot that different logits round to the same weight: the order by weight then
            // breaks ties by id across tokens the candidates left out.
            SamplingParams { top_k: 3, temperature: 1e8, ..Default::default() },
        ];
        let (mut decided, mut drawn) = (0, 0);
        for (case, params) in settings.into_iter().enumerate() {
            let params = SamplingParams { seed: Some(case as u64), ..params };
            let mut whole = sampler(params.clone());
            let mut from_candidates = sampler(params);
            for draw in 0..200 {
                // Rows with ties (logits on a coarse grid), and crowded searches that let go of
                // tokens after 8 or 30 candidates only.
                let grid = [0.0, 0.5, 0.01][draw % 3];
                let row: Vec<f32> = (0..1000)
                    .map(|_| {
                        let l = rng.random_range(-12.0f32..12.0);
                        if grid > 0.0 { (l / grid).round() * grid } else { l }
                    })
                    .collect();
                let (candidates, let_go) = candidates_of(&row, [64, 30, 8][draw % 4 % 3]);
                let expected = whole.sample(&row).unwrap();
                let got = match from_candidates.sample_candidates(&candidates, let_go) {
                    Some(token) => {
                        decided += 1;
                        token
                    }
                    None => from_candidates.sample(&row).unwrap(),
                };
                drawn += 1;
                assert_eq!(got, expected, "case {case}, draw {draw}");
            }
        }
        assert!(decided * 2 > drawn, "the candidates decided only {decided} of {drawn} draws");
    }

    #[test]
    fn masked_draws_take_only_allowed_tokens_and_candidates_agree_with_the_row() {
        let mut rng = SmallRng::seed_from_u64(9);
        let settings = [
            SamplingParams { temperature: 0.0, ..Default::default() },
            SamplingParams { top_k: 40, temperature: 0.8, ..Default::default() },
            SamplingParams { top_k: 10, min_p: 0.1, ..Default::default() },
        ];
        let mut decided = 0;
        for (case, params) in settings.into_iter().enumerate() {
            let params = SamplingParams { seed: Some(case as u64), ..params };
            let mut whole = sampler(params.clone());
            let mut from_candidates = sampler(params);
            for draw in 0..200 {
                let row: Vec<f32> = (0..1000).map(|_| rng.random_range(-8.0f32..8.0)).collect();
                // A sparse mask (as a grammar's usually is) or a dense one.
                let density = [0.02, 0.7][draw % 2];
                let mut words = vec![0u32; 1000usize.div_ceil(32)];
                for id in 0..1000 {
                    if rng.random_bool(density) {
                        words[id / 32] |= 1 << (id % 32);
                    }
                }
                words[0] |= 1 << 5; // never empty
                let allowed = AllowedTokens::new(&words);
                let (candidates, let_go) = candidates_of(&row, 64);
                let expected = whole.sample_allowed(&row, Some(allowed)).unwrap();
                assert!(allowed.allows(expected), "case {case}, draw {draw}: {expected} is not allowed");
                let got = match from_candidates.sample_candidates_allowed(&candidates, let_go, Some(allowed))
                {
                    Some(token) => {
                        decided += 1;
                        token
                    }
                    None => from_candidates.sample_allowed(&row, Some(allowed)).unwrap(),
                };
                assert_eq!(got, expected, "case {case}, draw {draw}");
            }
        }
        assert!(decided > 100, "the candidates decided only {decided} draws");
        let none = AllowedTokens::new(&[0, 0]);
        let error = sampler(SamplingParams::default()).sample_allowed(&[1.0; 40], Some(none)).err().unwrap();
        assert!(error.to_string().contains("grammar"), "{error}");
    }

    #[test]
    fn candidates_are_not_used_when_the_whole_row_matters() {
        let needs = |params: SamplingParams| sampler(params).candidates_needed();
        assert_eq!(needs(SamplingParams { temperature: 0.0, ..Default::default() }), Some(1));
        assert_eq!(needs(SamplingParams { top_k: 50, ..Default::default() }), Some(50));
        assert_eq!(needs(SamplingParams::default()), None, "sampling from every token");
        assert_eq!(needs(SamplingParams { top_k: 65, ..Default::default() }), None);
        assert_eq!(
            needs(SamplingParams { temperature: 0.0, presence_penalty: 0.5, ..Default::default() }),
            None
        );
        let bias = SamplingParams { temperature: 0.0, logit_bias: [(1, 2.0)].into(), ..Default::default() };
        assert_eq!(needs(bias), None);
        // Stop tokens are masked for the first two tokens: the whole row until then.
        let params = SamplingParams { temperature: 0.0, min_new_tokens: 2, ..Default::default() };
        let mut s = Sampler::new(params, 0, 1000, &[], &[2]).unwrap();
        let row = [0.0, 1.0, 5.0];
        assert_eq!(s.candidates_needed(), None);
        assert_eq!(s.sample_candidates(&[(2, 5.0), (1, 1.0), (0, 0.0)], f32::NEG_INFINITY), None);
        s.sample(&row).unwrap();
        s.sample(&row).unwrap();
        assert_eq!(s.sample_candidates(&[(2, 5.0), (1, 1.0), (0, 0.0)], f32::NEG_INFINITY), Some(2));
    }

    #[test]
    fn top_logprobs_are_the_largest_in_order() {
        let logprobs = [-3.0, -0.5, f64::NAN, -0.5, -9.0, -1.0];
        assert_eq!(top_logprobs(&logprobs, 3), vec![(1, -0.5), (3, -0.5), (5, -1.0)]);
        assert_eq!(top_logprobs(&logprobs, 0), vec![]);
        assert_eq!(top_logprobs(&logprobs, 10).len(), 5);
    }
}
