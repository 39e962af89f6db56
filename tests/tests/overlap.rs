//! Overlapped decode steps (`EngineOptions::overlap_steps`) change nothing of what requests
//! get: the same requests, run on an engine with the overlap and on one without, give the same
//! tokens, text and finish reasons: greedy, seeded top-k, stop strings, stop tokens,
//! `max_new_tokens` at every small value, aborts, and a batch mixing greedy draws with draws
//! that read whole rows (logprobs) or sample.

mod running;

use flint_core::engine::{
    EngineMetrics, EngineOptions, FinishReason, GenerateOutput, GenerateRequest, GenerationStream, Prompts,
    StopMatch,
};
use flint_core::sample::SamplingParams;
use futures::StreamExt;
use running::Running;

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "To make a cup of tea, first",
];

fn request(prompt: &str, sampling: SamplingParams, stream: bool) -> GenerateRequest {
    GenerateRequest { text: Some(Prompts::One(prompt.into())), sampling, stream, ..Default::default() }
}

fn greedy(max_new_tokens: usize) -> SamplingParams {
    SamplingParams { temperature: 0.0, max_new_tokens, ignore_eos: true, ..Default::default() }
}

/// What a request got: its ids, its text and its finish reason.
type Outcome = (Vec<u32>, String, Option<FinishReason>);

/// A request's items, streamed or not, joined into one: text and ids concatenated, the last
/// item's finish reason.
fn joined(stream: GenerationStream) -> Outcome {
    let items: Vec<GenerateOutput> = futures::executor::block_on(stream.collect::<Vec<_>>())
        .into_iter()
        .map(|item| item.unwrap_or_else(|e| panic!("request failed: {e}")))
        .collect();
    let ids = items.iter().flat_map(|i| i.output_ids.clone()).collect();
    let text = items.iter().map(|i| i.text.as_str()).collect();
    (ids, text, items.last().and_then(|i| i.meta_info.finish_reason.clone()))
}

/// What one engine gives for every case, in order, and its metrics once idle.
fn outcomes(overlap_steps: bool) -> (Vec<Outcome>, EngineMetrics) {
    let running = Running::start(EngineOptions { overlap_steps: Some(overlap_steps), ..Default::default() });
    let engine = &running.engine;
    let mut all = Vec::new();

    // Greedy, whole and streamed, and every small max_new_tokens (the overlap looks one token
    // ahead of the host, so the first tokens and the last are where it could go wrong).
    let free = joined(engine.generate(request(PROMPTS[0], greedy(24), false)));
    all.push(free.clone());
    all.push(joined(engine.generate(request(PROMPTS[0], greedy(24), true))));
    for max in 1..=4 {
        all.push(joined(engine.generate(request(PROMPTS[1], greedy(max), true))));
    }

    // A stop string: the text of tokens 6 and 7 of the free output; a stop token: token 9.
    let tokenizer = engine.tokenizer();
    let stop = tokenizer.decode(&free.0[6..8], true).unwrap();
    let stopped = SamplingParams { stop: vec![stop.clone()], ..greedy(24) };
    let by_string = joined(engine.generate(request(PROMPTS[0], stopped.clone(), true)));
    assert_eq!(by_string.2, Some(FinishReason::Stop { matched: StopMatch::Text(stop) }));
    all.push(by_string);
    all.push(joined(engine.generate(request(PROMPTS[0], stopped, false))));
    let by_token = SamplingParams { stop_token_ids: vec![free.0[9]], ..greedy(24) };
    let by_token = joined(engine.generate(request(PROMPTS[0], by_token, true)));
    assert!(matches!(by_token.2, Some(FinishReason::Stop { matched: StopMatch::Token(_) })), "{by_token:?}");
    all.push(by_token);

    // Seeded top-k.
    let seeded = SamplingParams { temperature: 0.9, top_k: 40, seed: Some(77), ..greedy(16) };
    all.push(joined(engine.generate(request(PROMPTS[2], seeded.clone(), true))));

    // A mixed batch: greedy streams beside a sampled one and one that reads whole rows for its
    // logprobs; once those two end (they are shorter), the greedy ones go on overlapped.
    let mut logprobs = request(PROMPTS[3], greedy(5), false);
    logprobs.return_logprob = true;
    let batch: Vec<GenerationStream> = vec![
        engine.generate(request(PROMPTS[0], greedy(20), true)),
        engine.generate(request(PROMPTS[1], SamplingParams { max_new_tokens: 6, ..seeded }, false)),
        engine.generate(logprobs),
        engine.generate(request(PROMPTS[2], greedy(17), false)),
    ];
    all.extend(batch.into_iter().map(joined));

    // An abort: what the stream got before it is where the free output starts.
    let mut aborted = request(PROMPTS[0], greedy(24), true);
    aborted.rid = Some("aborted".into());
    let mut stream = engine.generate(aborted);
    let first = futures::executor::block_on(stream.next()).unwrap().unwrap();
    engine.abort("aborted");
    let (mut ids, _, reason) = joined(stream);
    ids.splice(0..0, first.output_ids);
    assert!(free.0.starts_with(&ids), "aborted after {ids:?}, the free output is {:?}", free.0);
    assert!(matches!(reason, Some(FinishReason::Abort | FinishReason::Length { .. })), "{reason:?}");

    let metrics = running.idle_metrics();
    assert_eq!(metrics.kv_blocks_used, 0, "{metrics:?}");
    running.finish();
    (all, metrics)
}

#[test]
fn outputs_are_the_same_with_overlapped_steps_on_and_off() {
    let (on, on_metrics) = outcomes(true);
    let (off, off_metrics) = outcomes(false);
    assert_eq!(on.len(), off.len());
    for (case, (on, off)) in on.iter().zip(&off).enumerate() {
        assert_eq!(on, off, "case {case}");
    }
    // The overlap ran (and only where it was asked for).
    assert!(on_metrics.overlapped_steps > 40, "{on_metrics:?}");
    assert_eq!(off_metrics.overlapped_steps, 0, "{off_metrics:?}");
}
