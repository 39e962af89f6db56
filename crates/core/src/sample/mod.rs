//! Choosing the next token from a row of logits: greedy, or temperature with top-k, top-p and
//! min-p filtering, from a seeded random source so a request with a seed is reproducible.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{Error, Result};

/// How to choose tokens (the subset of the request contract's sampling parameters that the
/// single-sequence generator applies; defaults as in the design brief).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Softmax temperature; below 1e-6 means greedy.
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; in (0, 1].
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; -1 keeps all.
    pub top_k: i32,
    /// Drop tokens less likely than `min_p` times the most likely one; in [0, 1].
    pub min_p: f32,
    /// Seed of the random source; `None` draws one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_new_tokens: 128,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            seed: None,
        }
    }
}

/// Temperatures below this are greedy decoding.
const GREEDY_BELOW: f32 = 1e-6;

impl SamplingParams {
    /// Checks every field's range; the error names the field and its valid range.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &'static str, value: String, range: &str| {
            Err(Error::InvalidParameter { field, reason: format!("{value} is outside {range}") })
        };
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
        Ok(())
    }

    /// True when these parameters choose the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW || self.top_k == 1
    }
}

/// Draws tokens for one sequence.
pub struct Sampler {
    params: SamplingParams,
    rng: SmallRng,
    /// Scratch: (token, probability) of the candidates still in play.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for `params` (validated here). Without a seed, `fallback_seed` is used: the
    /// host supplies entropy, since the core has no clock or OS randomness of its own on the web.
    pub fn new(params: SamplingParams, fallback_seed: u64) -> Result<Self> {
        params.validate()?;
        let rng = SmallRng::seed_from_u64(params.seed.unwrap_or(fallback_seed));
        Ok(Sampler { params, rng, candidates: Vec::new() })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token from `logits` (one row over the vocabulary). NaN logits are
    /// never chosen; a row with no finite logit is an error.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        let best = argmax(logits).ok_or_else(|| Error::InvalidParameter {
            field: "logits",
            reason: "the row has no finite value".into(),
        })?;
        if self.params.is_greedy() {
            return Ok(best);
        }
        let inv_temperature = 1.0 / self.params.temperature;
        let max_logit = logits[best as usize];
        self.candidates.clear();
        self.candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, ((l - max_logit) * inv_temperature).exp())),
        );
        // Most likely first; ties by id so the order (and so a seeded draw) is deterministic.
        let by_probability = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.params.top_k > 0 && (self.params.top_k as usize) < self.candidates.len() {
            let k = self.params.top_k as usize;
            self.candidates.select_nth_unstable_by(k - 1, by_probability);
            self.candidates.truncate(k);
        }
        self.candidates.sort_unstable_by(by_probability);
        let total: f32 = self.candidates.iter().map(|c| c.1).sum();
        // min-p: relative to the most likely token, whose weight is exp(0) = 1 before scaling.
        let min_weight = self.params.min_p * self.candidates[0].1;
        let mut kept = 0;
        let mut mass = 0.0;
        for &(_, weight) in &self.candidates {
            if kept > 0 && (weight < min_weight || mass >= self.params.top_p * total) {
                break;
            }
            mass += weight;
            kept += 1;
        }
        self.candidates.truncate(kept);
        let mut draw = self.rng.random::<f32>() * mass;
        for &(token, weight) in &self.candidates {
            if draw < weight {
                return Ok(token);
            }
            draw -= weight;
        }
        Ok(self.candidates[kept - 1].0)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(params: SamplingParams) -> Sampler {
        Sampler::new(params, 7).unwrap()
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
        ];
        let fields = ["temperature", "temperature", "top_p", "top_p", "top_k", "top_k", "min_p"];
        for (params, field) in bad.into_iter().zip(fields) {
            let err = Sampler::new(params, 0).err().unwrap().to_string();
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
}
