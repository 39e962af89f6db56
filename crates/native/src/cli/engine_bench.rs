//! `flint bench --streams 1,4,16`: aggregate decode speed of the engine (continuous batching,
//! sampling, streaming, everything a server would run) at several numbers of concurrent
//! streams, and each figure's ratio to the single-stream one.

use std::thread::JoinHandle;
use std::time::Instant;

use flint_core::engine::{Engine, EngineOptions, GenerateRequest, Prompts};
use flint_core::sample::SamplingParams;
use futures::StreamExt;
use serde::Serialize;

/// The figures of one number of streams.
#[derive(Clone, Debug, Serialize)]
pub struct StreamsReport {
    /// Requests streamed at once.
    pub streams: usize,
    /// Tokens generated per second over all streams while every one of them is decoding: from
    /// the moment the last has its first token to the moment the first ends (median run).
    pub decode_tokens_per_s: f64,
    /// `decode_tokens_per_s` over the single-stream figure (when 1 was measured).
    pub ratio_to_one_stream: Option<f64>,
    /// Median time from submission to the first token, over the streams of the median run.
    pub time_to_first_token_s: f64,
}

/// Runs `repeats` timed rounds (after one warm-up) of `streams` concurrent greedy requests for
/// each entry of `streams_list`, each with a distinct `prompt_tokens`-token prompt (no prefix
/// cache hits) and `gen_tokens` generated tokens (fewer if `json_schema`, which holds every
/// output to it, ends them first).
pub fn run(
    engine: &Engine,
    prompt: &[u32],
    gen_tokens: usize,
    streams_list: &[usize],
    repeats: usize,
    json_schema: Option<&serde_json::Value>,
) -> anyhow::Result<Vec<StreamsReport>> {
    anyhow::ensure!(gen_tokens >= 2, "--gen-tokens must be >= 2");
    let mut reports: Vec<StreamsReport> = Vec::new();
    let mut round = 0u32;
    for &streams in streams_list {
        anyhow::ensure!(streams >= 1, "--streams lists numbers of streams, each >= 1");
        let mut runs = Vec::new();
        for run in 0..=repeats {
            round += 1;
            let figures = one_round(engine, prompt, gen_tokens, streams, round, json_schema)?;
            if run > 0 {
                runs.push(figures);
            }
        }
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (decode_tokens_per_s, time_to_first_token_s) = runs[runs.len() / 2];
        let one = reports.iter().find(|r| r.streams == 1).map(|r| r.decode_tokens_per_s);
        reports.push(StreamsReport {
            streams,
            decode_tokens_per_s,
            ratio_to_one_stream: one.map(|one| decode_tokens_per_s / one),
            time_to_first_token_s,
        });
    }
    Ok(reports)
}

/// One round: (aggregate decode tokens/s, median time to first token).
///
/// The streams are consumed by one thread, as a server's few async workers would: (16 threads
/// woken after every step cost lavapipe, which runs on the same cores, a quarter of its speed.)
/// The rate counts the tokens that arrive while every stream is decoding: from the moment the
/// last stream has its first token to the moment the first stream ends.
fn one_round(
    engine: &Engine,
    prompt: &[u32],
    gen_tokens: usize,
    streams: usize,
    round: u32,
    json_schema: Option<&serde_json::Value>,
) -> anyhow::Result<(f64, f64)> {
    let submitted = Instant::now();
    let consumers = (0..streams).map(|i| {
        // A distinct first token per stream and round keeps the prefix cache out of it.
        let mut ids = prompt.to_vec();
        ids[0] = 1000 + round * 64 + i as u32;
        let request = GenerateRequest {
            input_ids: Some(Prompts::One(ids)),
            sampling: SamplingParams {
                temperature: 0.0,
                max_new_tokens: gen_tokens,
                ignore_eos: true,
                json_schema: json_schema.cloned(),
                ..Default::default()
            },
            stream: true,
            ..Default::default()
        };
        let mut stream = engine.generate(request);
        async move {
            // (arrival, tokens) of every item with tokens.
            let mut arrivals = Vec::new();
            while let Some(item) = stream.next().await {
                let tokens = item?.output_ids.len();
                if tokens > 0 {
                    arrivals.push((Instant::now(), tokens));
                }
            }
            anyhow::ensure!(!arrivals.is_empty(), "a stream ended without tokens");
            anyhow::Ok(arrivals)
        }
    });
    let results = futures::executor::block_on(futures::future::join_all(consumers))
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let all_decoding = results.iter().map(|r| r[0].0).max().unwrap_or(submitted);
    let first_end = results.iter().filter_map(|r| r.last()).map(|a| a.0).min().unwrap_or(submitted);
    let tokens: usize =
        results.iter().flatten().filter(|(at, _)| *at > all_decoding && *at <= first_end).map(|a| a.1).sum();
    let seconds = first_end.duration_since(all_decoding).as_secs_f64();
    anyhow::ensure!(
        tokens > 0 && seconds > 0.0,
        "the streams never all decoded at once: raise --gen-tokens above the prompt's prefill steps"
    );
    let mut firsts: Vec<f64> =
        results.iter().map(|r| r[0].0.duration_since(submitted).as_secs_f64()).collect();
    firsts.sort_by(f64::total_cmp);
    Ok((tokens as f64 / seconds, firsts[firsts.len() / 2]))
}

/// Starts an engine on `model` with room for `streams` sequences of `tokens` tokens each; its
/// step loop runs on a thread of its own, overlapping decode steps as `overlap_steps` says (`None`: as the device does by default).
pub fn start(
    model: flint_core::model::Model,
    tokenizer: flint_core::tokenizer::Tokenizer,
    max_streams: usize,
    tokens: usize,
    overlap_steps: Option<bool>,
) -> anyhow::Result<(Engine, JoinHandle<()>)> {
    let per_sequence = tokens.next_multiple_of(flint_core::model::KV_BLOCK_TOKENS);
    let options = EngineOptions {
        max_running: max_streams.max(1),
        step_token_budget: 256.max(max_streams),
        kv_cache_tokens: Some(per_sequence * max_streams.max(1)),
        prefix_cache: false,
        seed: 0,
        overlap_steps,
    };
    let (engine, step_loop) = Engine::new(model, tokenizer, options)?;
    let thread = std::thread::spawn(move || futures::executor::block_on(step_loop.run()));
    Ok((engine, thread))
}
