//! The GPU side of sampling (`shaders/sample.wgsl`): the most likely tokens of each row of
//! logits, so that a decode step reads back a few candidates per sequence instead of a whole
//! row of the vocabulary.
//!
//! [`top_candidates`] records the kernel; [`RowCandidates::parse`] reads its output. Besides the
//! candidates, each row reports the largest logit the kernel let go of: every token above it is
//! among the candidates, which tells the sampler whether they decide its draw exactly (see
//! [`crate::sample::Sampler::sample_candidates`]).
//!
//! ```no_run
//! # async fn example(ctx: &flint_core::gpu::GpuContext) -> flint_core::Result<()> {
//! use flint_core::gpu::Tensor;
//! use flint_core::kernels::sample::{CandidateDepth, RowCandidates, top_candidates};
//!
//! let logits = Tensor::from_slice(ctx, "logits", &[1, 4], &[0.5f32, 3.0, -1.0, 2.0])?;
//! let depth = CandidateDepth::Top;
//! let out = Tensor::empty(ctx, "candidates", &[1, depth.words_per_row()])?;
//! let mut encoder = ctx.encoder("sample");
//! top_candidates(ctx, &mut encoder, &logits, depth, &out)?;
//! ctx.submit(encoder)?;
//! let rows = RowCandidates::parse(&out.to_u32(ctx).await?, depth);
//! assert_eq!(rows[0].tokens[..2], [(1, 3.0), (3, 2.0)]);
//! # Ok(())
//! # }
//! ```

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, Tensor};
use crate::kernels::ensure;

const SOURCE: &str = include_str!("../../shaders/sample.wgsl");
const WG_SIZE: usize = 128;

/// The most candidates [`CandidateDepth::Top`] returns per row: enough for top-k sampling with
/// `top_k` up to this many.
pub const MAX_CANDIDATES: usize = 64;

/// How many candidates to find per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CandidateDepth {
    /// The most likely token only (greedy decoding): the cheapest form.
    Best,
    /// The [`MAX_CANDIDATES`] most likely tokens.
    Top,
}

impl CandidateDepth {
    /// (entries each lane keeps, candidates written per row).
    fn sizes(self) -> (usize, usize) {
        match self {
            CandidateDepth::Best => (1, 1),
            CandidateDepth::Top => (8, MAX_CANDIDATES),
        }
    }

    /// Candidates written per row.
    pub fn count(self) -> usize {
        self.sizes().1
    }

    /// u32 words of output per row: ids, logits, and the largest logit let go of.
    pub fn words_per_row(self) -> usize {
        2 * self.count() + 1
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    n: u32,
    _pad: [u32; 2],
}

/// Records the search for the most likely tokens of every row of `logits` `[rows, vocab]` into
/// `out` (u32 `[rows, depth.words_per_row()]`, read with [`RowCandidates::parse`]).
pub fn top_candidates(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    logits: &Tensor,
    depth: CandidateDepth,
    out: &Tensor,
) -> Result<()> {
    const ENTRY: &str = "top_candidates";
    let (rows, vocab) = match logits.shape() {
        [rows, vocab] => (*rows, *vocab),
        shape => return Err(shape_error(ENTRY, shape)),
    };
    ensure(ENTRY, vocab > 0, || "the rows are empty".to_string())?;
    ensure(ENTRY, out.len() == rows * depth.words_per_row(), || {
        format!(
            "{rows} rows need an output of {} words, but it has {}",
            rows * depth.words_per_row(),
            out.len()
        )
    })?;
    ensure(ENTRY, out.buffer() != logits.buffer(), || "the output must not be the logits".to_string())?;
    if rows == 0 {
        return Ok(());
    }
    let (list, count) = depth.sizes();
    let source = KernelSource::new(ENTRY, &[SOURCE])
        .define("WG_SIZE", format!("{WG_SIZE}u"))
        .define("LIST", format!("{list}u"))
        .define("OUT_COUNT", format!("{count}u"));
    let params = encoder.params(ctx, &Params { rows: rows as u32, n: vocab as u32, _pad: [0; 2] })?;
    ctx.dispatch(
        encoder,
        &source,
        &[params.binding(), logits.binding(), out.binding()],
        ctx.grid(rows as u32),
    )
}

fn shape_error(kernel: &'static str, shape: &[usize]) -> crate::Error {
    crate::Error::KernelArguments {
        kernel,
        reason: format!("the logits have shape {shape:?}; they must be [rows, vocab]"),
    }
}

/// One row's candidates, as [`top_candidates`] found them.
#[derive(Clone, Debug, PartialEq)]
pub struct RowCandidates {
    /// (token, logit), largest logit first, ties by smaller token id; finite logits only.
    pub tokens: Vec<(u32, f32)>,
    /// The largest finite logit of a token that is not among `tokens` (`-inf` when there is
    /// none): every token with a larger logit is among them.
    pub let_go: f32,
}

impl RowCandidates {
    /// Splits the output of [`top_candidates`] at `depth` into rows.
    pub fn parse(words: &[u32], depth: CandidateDepth) -> Vec<RowCandidates> {
        let count = depth.count();
        words
            .chunks_exact(depth.words_per_row())
            .map(|row| {
                let tokens = row[..count]
                    .iter()
                    .zip(&row[count..2 * count])
                    .map(|(&id, &bits)| (id, f32::from_bits(bits)))
                    .filter(|(_, logit)| logit.is_finite())
                    .collect();
                RowCandidates { tokens, let_go: f32::from_bits(row[2 * count]) }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{POISON, Rng, gpu};

    /// The CPU reference: every finite (token, logit), largest first, ties by smaller id.
    fn sorted_row(row: &[f32]) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> =
            row.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all
    }

    fn run(logits: &[f32], rows: usize, depth: CandidateDepth) -> Vec<RowCandidates> {
        let ctx = gpu();
        let vocab = logits.len() / rows;
        let input = Tensor::from_slice(ctx, "logits", &[rows, vocab], logits).unwrap();
        let out = Tensor::empty(ctx, "candidates", &[rows, depth.words_per_row()]).unwrap();
        out.fill_bits(ctx, POISON);
        let mut encoder = ctx.encoder("test");
        top_candidates(ctx, &mut encoder, &input, depth, &out).unwrap();
        ctx.submit(encoder).unwrap();
        RowCandidates::parse(&pollster::block_on(out.to_u32(ctx)).unwrap(), depth)
    }

    /// The candidates above `let_go` must be the true order's first tokens, and all of them;
    /// every slot must be filled that the lanes could fill; `let_go` must be a left-out logit.
    fn check(what: &str, row: &[f32], found: &RowCandidates, depth: CandidateDepth) -> usize {
        let truth = sorted_row(row);
        let in_order = |a: &(u32, f32), b: &(u32, f32)| a.1 > b.1 || (a.1 == b.1 && a.0 < b.0);
        assert!(found.tokens.windows(2).all(|w| in_order(&w[0], &w[1])), "{what}: not sorted");
        let exact = found.tokens.iter().filter(|(_, l)| *l > found.let_go).count();
        assert_eq!(found.tokens[..exact], truth[..exact], "{what}: not the most likely tokens in order");
        let above = truth.iter().filter(|(_, l)| *l > found.let_go).count();
        assert_eq!(above, exact, "{what}: tokens above let_go {} are missing", found.let_go);
        let (list, count) = depth.sizes();
        let fillable: usize = (0..WG_SIZE)
            .map(|lane| row.iter().skip(lane).step_by(WG_SIZE).filter(|l| l.is_finite()).count().min(list))
            .sum();
        assert_eq!(found.tokens.len(), fillable.min(count), "{what}: candidates missing");
        let chosen: std::collections::HashSet<u32> = found.tokens.iter().map(|t| t.0).collect();
        let mut left_out = truth.iter().filter(|t| !chosen.contains(&t.0));
        if found.let_go == f32::NEG_INFINITY {
            assert!(left_out.next().is_none(), "{what}: tokens were left out but let_go is -inf");
        } else {
            assert!(left_out.any(|(_, l)| *l == found.let_go), "{what}: let_go is no left-out logit");
        }
        exact
    }

    /// `n` distinct logits in `[-20, 20)` in random order. Uniform draws are not enough: at
    /// 262144 draws, two of the largest 65 tie often enough (a few percent of seeds) that the
    /// tie straddles the last candidate and rightly leaves it inexact.
    fn distinct_logits(rng: &mut Rng, n: usize) -> Vec<f32> {
        let mut logits: Vec<f32> = (0..n).map(|i| -20.0 + 40.0 * i as f32 / n as f32).collect();
        for i in (1..n).rev() {
            logits.swap(i, rng.usize(0, i + 1));
        }
        logits
    }

    #[test]
    fn candidates_are_the_most_likely_tokens_in_order() {
        let mut rng = Rng::new("top_candidates");
        for (rows, vocab) in [(1, 1), (3, 7), (2, 1000), (5, 49_157), (1, 262_144)] {
            for damaged in [false, true] {
                let mut logits = distinct_logits(&mut rng, rows * vocab);
                if damaged {
                    // Ties, masked and broken logits, as logit bias and bad weights make them.
                    for _ in 0..rows * 20 {
                        let i = rng.usize(0, logits.len());
                        logits[i] =
                            [f32::NEG_INFINITY, f32::NAN, f32::INFINITY, 19.999, 7.0][rng.usize(0, 5)];
                    }
                }
                for depth in [CandidateDepth::Best, CandidateDepth::Top] {
                    let found = run(&logits, rows, depth);
                    assert_eq!(found.len(), rows);
                    for (r, row) in logits.chunks_exact(vocab).enumerate() {
                        let what = format!("{rows}x{vocab} {depth:?} damaged={damaged} row {r}");
                        let exact = check(&what, row, &found[r], depth);
                        // Distinct logits leave every candidate exact: that is what makes them
                        // useful to the sampler.
                        if !damaged && vocab >= 1000 {
                            assert_eq!(exact, depth.count(), "{what}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn crowded_lanes_let_go_of_what_they_cannot_keep() {
        // The 100 largest logits all fall to lane 0 (ids that are multiples of 128): it keeps 8
        // and must report what it let go of, so only those 8 count as exact.
        let vocab = 128 * 100;
        let logits: Vec<f32> =
            (0..vocab).map(|i| if i % 128 == 0 { 10.0 + i as f32 / 1e4 } else { 0.0 }).collect();
        let found = &run(&logits, 1, CandidateDepth::Top)[0];
        assert_eq!(check("crowded", &logits, found, CandidateDepth::Top), 8);
    }

    #[test]
    fn rows_without_a_finite_logit_have_no_candidates() {
        let logits = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 1.0, f32::NAN, f32::NAN];
        let found = run(&logits, 2, CandidateDepth::Top);
        assert_eq!(found[0], RowCandidates { tokens: vec![], let_go: f32::NEG_INFINITY });
        assert_eq!(found[1], RowCandidates { tokens: vec![(0, 1.0)], let_go: f32::NEG_INFINITY });
        let flat = Tensor::empty(gpu(), "flat logits", &[6]).unwrap();
        let out = Tensor::empty(gpu(), "out", &[3]).unwrap();
        let error = top_candidates(gpu(), &mut gpu().encoder("x"), &flat, CandidateDepth::Best, &out);
        assert!(error.unwrap_err().to_string().contains("[rows, vocab]"));
    }
}
