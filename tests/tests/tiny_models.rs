//! qwen2 and qwen3 end to end against llama.cpp, on tiny random-weight models: one file per
//! architecture and weight type (Q4_0, Q8_0, Q4_K, Q6_K, F16; norms and biases F32), written by
//! `scripts/fixtures/make_tiny_models.py`. The GGUF files are not committed:
//! `scripts/fixtures/make_tiny_models.sh` regenerates them into the model cache and checks each
//! against the sha256 that its fixture (`tests/fixtures/tiny_models/*.json`) was computed on;
//! `scripts/fixtures/README.md` says how the fixtures were made.
//!
//! Each test prefills the fixture's 32-token prompt in one forward pass with logits at every
//! position, then feeds llama.cpp's greedy continuation one token at a time (teacher-forced, so
//! flint sees the tokens llama.cpp saw) and checks at every one of the 39 positions, on the ids
//! the fixture records (llama.cpp's top 8, 16 fixed probe ids, the exact pass's top 2):
//! - flint's logits against llama.cpp's, within the weight type's [`llama_cpp_bound`];
//! - flint's logits against the exact float64 forward pass of the same file
//!   (`scripts/fixtures/reference_forward.py`, recorded in the fixture), within [`EXACT_BOUND`];
//! - flint's top-1 (its greedy choice) against the exact pass's top-1, and against llama.cpp's
//!   up to near-ties: it must be one of the ids whose llama.cpp logit is within twice the bound
//!   of llama.cpp's best, since both engines may be that far apart.
//!
//! The files' vocabulary (gpt2-kind BPE, `qwen2` pre-tokenizer, synthetic merges) is checked
//! too: flint's tokenizer must split the fixtures' texts into llama.cpp's ids.

use std::sync::Arc;

use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::model::{LogitRows, Model, SequenceChunk};
use flint_core::tokenizer::Tokenizer;
use flint_e2e::{repo_root, tiny_model_dir};

/// One fixture: what llama.cpp and the exact pass computed for one tiny model.
#[derive(serde::Deserialize)]
struct Fixture {
    model_file: String,
    architecture: String,
    weight_type: String,
    vocab_size: usize,
    prompt_ids: Vec<u32>,
    probe_ids: Vec<u32>,
    /// One record per prompt position: the next-token logits after it.
    prompt_logits: Vec<LogitRecord>,
    /// llama.cpp's greedy continuation of the prompt.
    greedy_ids: Vec<u32>,
    /// One record per fed continuation token but the last.
    decode_logits: Vec<LogitRecord>,
    llama_cpp_vs_exact: DistanceFromExact,
    /// llama.cpp's tokenization (no BOS, control tokens parsed) of a few texts.
    tokenize: Vec<Tokenization>,
}

#[derive(serde::Deserialize)]
struct Tokenization {
    text: String,
    ids: Vec<u32>,
}

/// The logits of some ids at one position: `top_ids`, then the fixture's `probe_ids`, then
/// `exact_top_ids`, as llama.cpp and as the exact pass computed them.
#[derive(serde::Deserialize)]
struct LogitRecord {
    /// llama.cpp's highest logits, best first.
    top_ids: Vec<u32>,
    /// The exact pass's two highest logits, best first.
    exact_top_ids: Vec<u32>,
    llama: Vec<f32>,
    exact: Vec<f32>,
}

/// How far llama.cpp's logits are from the exact ones, over every position and the whole
/// vocabulary.
#[derive(serde::Deserialize)]
struct DistanceFromExact {
    max_abs: f32,
}

/// The largest difference allowed between a logit of flint and of the exact float64 pass.
///
/// flint computes in f32 with an f16 KV cache, and the exact pass rounds its keys and values to
/// f16 too. Where an element's f32 and f64 values lie on either side of an f16 rounding boundary
/// the two round it an f16 ulp apart, which leaves flint on lavapipe within 7.2e-4 of the exact
/// logits (1.1e-5 when both kept f32 keys and values); other GPUs may add a few ulp in `exp` and
/// `inverseSqrt`. What the bound still catches (measured by perturbing the exact pass): an
/// RMSNorm epsilon of 1e-5 for 1e-6 (6e-3 to 8e-3), queries rounded to f16 as well (1.8e-3 to
/// 3.8e-3); a wrong bias, norm, rope base or rope pairing is off by 1 to 9.
const EXACT_BOUND: f32 = 2e-3;

/// The largest difference allowed between a logit of flint and of llama.cpp, per weight type.
///
/// llama.cpp's CPU backend rounds the activations entering every matmul to 8 bits with a scale
/// per 32 values (Q8_0, for Q4_0 and Q8_0 weights) or per 256 (Q8_K, for K-quant weights), or
/// to f16 (for F16 weights), and keeps keys and values in f16; over the layers of these
/// untrained models that rounding adds up to logit errors of about 2% of their RMS (2). The
/// fixtures record llama.cpp's largest distance from the exact logits
/// (`llama_cpp_vs_exact.max_abs`): Q4_0 0.147 (qwen2) and 0.232 (qwen3), Q8_0 0.140 and 0.217,
/// Q4_K 0.240 and 0.280, Q6_K 0.208 and 0.403, F16 0.0072 and 0.0097. Each bound is 1.5 times
/// the larger of the two, rounded up; flint being within [`EXACT_BOUND`] of the exact logits, it
/// is then within the bound of llama.cpp's. A wrong weight, bias, norm or rotation is off by 1
/// or more.
fn llama_cpp_bound(weight_type: &str) -> f32 {
    match weight_type {
        "Q4_0" | "Q8_0" => 0.35,
        "Q4_K" => 0.45,
        "Q6_K" => 0.65,
        "F16" => 0.015,
        other => panic!("no logit bound for weight type {other}"),
    }
}

fn read_fixture(name: &str) -> Fixture {
    let path = repo_root().join("tests/fixtures/tiny_models").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn gpu() -> Arc<GpuContext> {
    pollster::block_on(GpuContext::new(&GpuOptions::from_env()))
        .unwrap_or_else(|e| panic!("GPU tests need an adapter (they never skip): {e}"))
}

fn argmax(row: &[f32]) -> u32 {
    // The lowest id among equal maxima, as llama.cpp's greedy sampler picks.
    (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap() as u32
}

/// What the comparison found over all positions, for the failure message and the summary.
#[derive(Default)]
struct Comparison {
    positions: usize,
    /// Positions where llama.cpp's top-1 leads by more than twice the bound, so flint's top-1
    /// had to be exactly it.
    decisive_llama_top1: usize,
    max_error_llama: f32,
    max_error_exact: f32,
    failures: Vec<String>,
}

impl Comparison {
    /// Checks flint's logits `row` at the position described by `what` against `record`.
    fn position(
        &mut self,
        what: &str,
        row: &[f32],
        record: &LogitRecord,
        probe_ids: &[u32],
        llama_bound: f32,
    ) {
        self.positions += 1;
        let ids: Vec<u32> =
            record.top_ids.iter().chain(probe_ids).chain(&record.exact_top_ids).copied().collect();
        assert!(
            record.llama.len() == ids.len() && record.exact.len() == ids.len(),
            "{what}: malformed record"
        );
        for ((&id, &llama), &exact) in ids.iter().zip(&record.llama).zip(&record.exact) {
            let actual = row[id as usize];
            let (error_llama, error_exact) = ((actual - llama).abs(), (actual - exact).abs());
            // Written so that NaN fails: every comparison with NaN is false.
            if !(error_llama <= llama_bound && error_exact <= EXACT_BOUND) {
                self.failures.push(format!(
                    "{what}: logit of id {id}: flint {actual}, llama.cpp {llama} (bound {llama_bound}), exact {exact} \
                     (bound {EXACT_BOUND})"
                ));
            }
            self.max_error_llama = self.max_error_llama.max(error_llama);
            self.max_error_exact = self.max_error_exact.max(error_exact);
        }
        let top1 = argmax(row);

        // The exact top-1, unless its lead is within the exact bound's reach (then either of
        // the exact top 2 may win).
        let exact_top = &record.exact[ids.len() - record.exact_top_ids.len()..];
        let exact_allowed = if exact_top[0] - exact_top[1] < 2.0 * EXACT_BOUND {
            &record.exact_top_ids[..]
        } else {
            &record.exact_top_ids[..1]
        };
        if !exact_allowed.contains(&top1) {
            self.failures.push(format!(
                "{what}: top-1 is {top1} (logit {}), the exact pass's is {} (logit {}, {} above its second)",
                row[top1 as usize],
                record.exact_top_ids[0],
                exact_top[0],
                exact_top[0] - exact_top[1]
            ));
        }

        // llama.cpp's top-1, or any id of its top k within twice the bound of it. When all k are
        // that close, the winner may lie beyond them and nothing is checked.
        let llama_top = &record.llama[..record.top_ids.len()];
        let near: Vec<u32> = (record.top_ids.iter().zip(llama_top))
            .filter(|&(_, &logit)| logit >= llama_top[0] - 2.0 * llama_bound)
            .map(|(&id, _)| id)
            .collect();
        if near.len() == 1 {
            self.decisive_llama_top1 += 1;
        }
        if near.len() < record.top_ids.len() && !near.contains(&top1) {
            self.failures.push(format!(
                "{what}: top-1 is {top1} (logit {}), not among llama.cpp's best {near:?} (logits from {})",
                row[top1 as usize], llama_top[0]
            ));
        }
    }
}

/// Runs fixture `name`'s prompt and greedy continuation through flint and compares every
/// position with llama.cpp and with the exact pass.
fn matches_llama_cpp(name: &str, architecture: &str, weight_type: &str) {
    let fixture = read_fixture(name);
    assert_eq!((fixture.architecture.as_str(), fixture.weight_type.as_str()), (architecture, weight_type));
    let bound = llama_cpp_bound(weight_type);
    assert!(
        fixture.llama_cpp_vs_exact.max_abs * 1.5 <= bound,
        "{name}: llama.cpp is {} from the exact logits, more than the bound {bound} allows for: re-derive the \
         bound (see llama_cpp_bound)",
        fixture.llama_cpp_vs_exact.max_abs
    );
    // The continuation is llama.cpp's greedy one: each token is the previous position's top-1.
    let records = fixture.prompt_logits.iter().chain(&fixture.decode_logits);
    let greedy_from_records: Vec<u32> =
        records.skip(fixture.prompt_ids.len() - 1).map(|r| r.top_ids[0]).collect();
    assert_eq!(
        greedy_from_records, fixture.greedy_ids,
        "{name}: greedy_ids do not follow the recorded logits"
    );

    let ctx = gpu();
    let model = Model::load(ctx.clone(), &open_tiny_model(&fixture)).unwrap();
    assert_eq!(model.config().vocab_size, fixture.vocab_size);
    let vocab = fixture.vocab_size;
    let mut cache = model.new_kv_cache(Some(64)).unwrap();
    let mut sequence = cache.new_sequence();
    let mut comparison = Comparison::default();

    let prompt = &fixture.prompt_ids;
    assert_eq!(fixture.prompt_logits.len(), prompt.len());
    cache.append(&mut sequence, prompt.len()).unwrap();
    let chunk = SequenceChunk { table: &sequence, tokens: prompt, first_position: 0, logits: LogitRows::All };
    let logits = pollster::block_on(model.forward(&cache, &[chunk]).unwrap().to_f32(&ctx)).unwrap();
    assert_eq!(logits.len(), prompt.len() * vocab);
    for (position, (row, record)) in logits.chunks(vocab).zip(&fixture.prompt_logits).enumerate() {
        comparison.position(&format!("prompt position {position}"), row, record, &fixture.probe_ids, bound);
    }

    // Each continuation token goes in as a decode step of one token; its logits predict the next.
    for (step, (&token, record)) in fixture.greedy_ids.iter().zip(&fixture.decode_logits).enumerate() {
        let position = cache.append(&mut sequence, 1).unwrap().start;
        let chunk = SequenceChunk {
            table: &sequence,
            tokens: &[token],
            first_position: position,
            logits: LogitRows::Last,
        };
        let row = pollster::block_on(model.forward(&cache, &[chunk]).unwrap().to_f32(&ctx)).unwrap();
        assert_eq!(row.len(), vocab);
        let what = format!("decode step {step} (token {token} at position {position})");
        comparison.position(&what, &row, record, &fixture.probe_ids, bound);
    }
    cache.release(sequence);

    eprintln!(
        "{name}: {} positions; max |flint - llama.cpp| {:.4} (bound {bound}; llama.cpp vs exact {:.4}); max |flint - \
         exact| {:.2e} (bound {EXACT_BOUND:.0e}); llama.cpp's top-1 decisive at {} positions",
        comparison.positions,
        comparison.max_error_llama,
        fixture.llama_cpp_vs_exact.max_abs,
        comparison.max_error_exact,
        comparison.decisive_llama_top1
    );
    assert!(
        comparison.failures.is_empty(),
        "{name} differs at {} checks:\n{}",
        comparison.failures.len(),
        comparison.failures.join("\n")
    );
}

fn open_tiny_model(fixture: &Fixture) -> GgufFile {
    let path = tiny_model_dir().join(&fixture.model_file);
    GgufFile::open(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

#[test]
fn tokenizes_like_llama_cpp() {
    for name in FIXTURES {
        let fixture = read_fixture(name);
        let tokenizer = Tokenizer::from_gguf(&open_tiny_model(&fixture)).unwrap();
        for Tokenization { text, ids } in &fixture.tokenize {
            assert_eq!(&tokenizer.encode(text, false, true), ids, "{name}: ids of {text:?}");
            assert_eq!(&tokenizer.decode(ids, false).unwrap(), text, "{name}: text of {ids:?}");
        }
    }
}

macro_rules! tiny_model_tests {
    ($($test:ident: $name:literal, $architecture:literal, $weight_type:literal;)*) => {
        /// Every fixture in `tests/fixtures/tiny_models/`.
        const FIXTURES: &[&str] = &[$($name),*];
        $(
            #[test]
            fn $test() {
                matches_llama_cpp($name, $architecture, $weight_type);
            }
        )*
    };
}

tiny_model_tests! {
    qwen2_q4_0_matches_llama_cpp: "tiny-qwen2-q4_0", "qwen2", "Q4_0";
    qwen2_q8_0_matches_llama_cpp: "tiny-qwen2-q8_0", "qwen2", "Q8_0";
    qwen2_q4_k_matches_llama_cpp: "tiny-qwen2-q4_k", "qwen2", "Q4_K";
    qwen2_q6_k_matches_llama_cpp: "tiny-qwen2-q6_k", "qwen2", "Q6_K";
    qwen2_f16_matches_llama_cpp: "tiny-qwen2-f16", "qwen2", "F16";
    qwen3_q4_0_matches_llama_cpp: "tiny-qwen3-q4_0", "qwen3", "Q4_0";
    qwen3_q8_0_matches_llama_cpp: "tiny-qwen3-q8_0", "qwen3", "Q8_0";
    qwen3_q4_k_matches_llama_cpp: "tiny-qwen3-q4_k", "qwen3", "Q4_K";
    qwen3_q6_k_matches_llama_cpp: "tiny-qwen3-q6_k", "qwen3", "Q6_K";
    qwen3_f16_matches_llama_cpp: "tiny-qwen3-f16", "qwen3", "F16";
}
