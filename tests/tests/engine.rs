//! The engine with the real SmolLM2 model on the GPU: continuous batching gives each request
//! what it would get alone, a long prompt does not stall decoding streams, aborted and dropped
//! requests free their KV blocks, shared prefixes are reused, seeds are reproducible inside a
//! batch, stop strings that span tokens are cut, and a KV cache too small for the load
//! preempts and recomputes.
//!
//! Each test runs its own engine, its step loop on a thread of its own (as the native host
//! does), and consumes streams from the test thread.

mod running;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flint_core::engine::{
    EngineOptions, FinishReason, GenerateOutput, GenerateRequest, GenerationStream, Prompts, StopMatch,
};
use flint_core::sample::SamplingParams;
use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use running::Running;

fn request(prompt: &str, sampling: SamplingParams, stream: bool) -> GenerateRequest {
    GenerateRequest { text: Some(Prompts::One(prompt.into())), sampling, stream, ..Default::default() }
}

fn greedy(max_new_tokens: usize) -> SamplingParams {
    SamplingParams { temperature: 0.0, max_new_tokens, ..Default::default() }
}

fn collect(stream: GenerationStream) -> Vec<GenerateOutput> {
    futures::executor::block_on(stream.collect::<Vec<_>>())
        .into_iter()
        .map(|item| item.unwrap_or_else(|e| panic!("request failed: {e}")))
        .collect()
}

/// The single output of a non-streamed one-prompt request.
fn only(stream: GenerationStream) -> GenerateOutput {
    let mut items = collect(stream);
    assert_eq!(items.len(), 1, "{items:?}");
    items.remove(0)
}

/// A streamed request's items joined: text and ids concatenated, the last item's meta info.
fn joined(items: Vec<GenerateOutput>) -> GenerateOutput {
    let mut all = items[0].clone();
    for item in &items[1..] {
        all.text.push_str(&item.text);
        all.output_ids.extend(&item.output_ids);
        all.meta_info = item.meta_info.clone();
    }
    assert!(
        items.iter().rev().skip(1).all(|i| i.meta_info.finish_reason.is_none()),
        "only the last item ends"
    );
    all
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "def fibonacci(n):",
    "The largest planet in the solar system is",
    "To make a cup of tea, first",
    "In 1969, the first person to walk on the moon was",
];

#[test]
fn concurrent_greedy_requests_give_what_each_gives_alone() {
    let running = Running::start(EngineOptions { prefix_cache: false, ..Default::default() });
    let engine = &running.engine;
    let alone: Vec<Vec<u32>> =
        PROMPTS.iter().map(|p| only(engine.generate(request(p, greedy(12), false))).output_ids).collect();
    let streams: Vec<GenerationStream> =
        PROMPTS.iter().map(|p| engine.generate(request(p, greedy(12), false))).collect();
    let together: Vec<Vec<u32>> = streams.into_iter().map(|s| only(s).output_ids).collect();
    assert_eq!(together, alone);
    let metrics = running.idle_metrics();
    assert_eq!(metrics.kv_blocks_used, 0);
    assert!(metrics.generated_tokens >= 2 * 8 * 12 - 16, "{metrics:?}");
    running.finish();
}

#[test]
fn a_long_prompt_does_not_stall_decoding_streams() {
    let running = Running::start(EngineOptions::default());
    let engine = running.engine.clone();
    let decoding = SamplingParams { ignore_eos: true, ..greedy(48) };
    // Four streams decoding, each consumed on its own thread with the time of every item.
    let consumers: Vec<JoinHandle<Vec<Instant>>> = PROMPTS[..4]
        .iter()
        .map(|p| {
            let mut stream = engine.generate(request(p, decoding.clone(), true));
            std::thread::spawn(move || {
                let mut times = Vec::new();
                while let Some(item) = futures::executor::block_on(stream.next()) {
                    item.unwrap();
                    times.push(Instant::now());
                }
                times
            })
        })
        .collect();
    // Once they are decoding, a 600-token prompt arrives.
    while engine.metrics().generated_tokens < 8 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let long_prompt: Vec<u32> = (0..600).map(|i| 1000 + (i * 7919) % 30000).collect();
    let submitted = Instant::now();
    let long = engine.generate(GenerateRequest {
        input_ids: Some(Prompts::One(long_prompt)),
        sampling: greedy(2),
        stream: true,
        ..Default::default()
    });
    let mut long = long;
    let first_long_item = futures::executor::block_on(long.next()).unwrap().unwrap();
    let long_first_at = Instant::now();
    assert_eq!(first_long_item.meta_info.prompt_tokens, 600);
    drop(long);
    drop(engine);
    for consumer in consumers {
        let times = consumer.join().unwrap();
        let during_prefill = times.iter().filter(|&&t| t > submitted && t < long_first_at).count();
        // 600 tokens take three steps of a 256-token budget; every step gives each stream a token.
        assert!(
            during_prefill >= 2,
            "a stream got {during_prefill} tokens while the long prompt was prefilled"
        );
    }
    running.finish();
}

#[test]
fn aborted_and_dropped_requests_free_every_block() {
    let running = Running::start(EngineOptions::default());
    let engine = &running.engine;
    let mut rng = SmallRng::seed_from_u64(11);
    let mut aborted_by_rid = 0;
    for wave in 0..10 {
        let mut streams: Vec<(String, GenerationStream, usize, bool)> = (0..20)
            .map(|i| {
                let rid = format!("wave{wave}-{i}");
                let prompt = PROMPTS[rng.random_range(0..PROMPTS.len())];
                let sampling = SamplingParams {
                    max_new_tokens: rng.random_range(4..24),
                    seed: Some(rng.random()),
                    ignore_eos: true,
                    ..Default::default()
                };
                let mut req = request(prompt, sampling, true);
                req.rid = Some(rid.clone());
                (rid, engine.generate(req), rng.random_range(0..4), rng.random_bool(0.5))
            })
            .collect();
        for (rid, stream, after_items, by_rid) in streams.iter_mut() {
            for _ in 0..*after_items {
                if futures::executor::block_on(stream.next()).is_none() {
                    break;
                }
            }
            if *by_rid {
                engine.abort(rid);
            }
        }
        for (_, stream, _, by_rid) in streams {
            if by_rid {
                // An aborted stream ends with an abort (unless it had finished already).
                let items = collect(stream);
                if let Some(last) = items.last() {
                    let reason = last.meta_info.finish_reason.clone();
                    assert!(reason.is_some(), "the stream ended without a finish reason");
                    aborted_by_rid += usize::from(reason == Some(FinishReason::Abort));
                }
            }
            // The others are dropped here, mid-stream.
        }
    }
    assert!(aborted_by_rid > 20, "only {aborted_by_rid} requests were aborted before they finished");
    let metrics = running.idle_metrics();
    assert_eq!(metrics.kv_blocks_used, 0, "{metrics:?}");
    assert_eq!(metrics.kv_blocks_free, metrics.kv_blocks_total, "{metrics:?}");
    futures::executor::block_on(engine.flush_cache()).unwrap();
    let metrics = engine.metrics();
    assert_eq!(
        (metrics.kv_blocks_cached, metrics.kv_blocks_free),
        (0, metrics.kv_blocks_total),
        "{metrics:?}"
    );
    running.finish();
}

#[test]
fn a_shared_prefix_is_reused_and_answers_sooner() {
    let running = Running::start(EngineOptions::default());
    let engine = &running.engine;
    // A 300-token prefix, then a suffix of a few tokens: the first request with a given prefix
    // computes all of it, the second finds its 18 full blocks (288 tokens) in the prefix cache.
    let prefix =
        |round: u32| -> Vec<u32> { (0..300).map(|i| 2000 + (i * 104_729 + round * 7) % 20000).collect() };
    let time_to_first_item = |ids: Vec<u32>| {
        let started = Instant::now();
        let mut stream = engine.generate(GenerateRequest {
            input_ids: Some(Prompts::One(ids)),
            sampling: greedy(1),
            stream: true,
            ..Default::default()
        });
        let first = futures::executor::block_on(stream.next()).unwrap().unwrap();
        (started.elapsed(), first.meta_info.cached_tokens)
    };
    // Cold and warm alternate over three prefixes; the medians are compared.
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let (time, cached) = time_to_first_item([prefix(round), vec![11, 12, 13]].concat());
        assert_eq!(cached, 0, "a new prefix");
        cold.push(time);
        let (time, cached) = time_to_first_item([prefix(round), vec![21, 22]].concat());
        assert!(cached >= 256, "{cached} tokens reused");
        warm.push(time);
    }
    cold.sort();
    warm.sort();
    assert!(warm[1] < cold[1], "time to first token {warm:?} with the prefix cached, {cold:?} without");
    let metrics = running.idle_metrics();
    assert!(metrics.prefix_cache_hit_rate > 0.4, "{metrics:?}");
    running.finish();
}

#[test]
fn parallel_samples_share_their_prompt_blocks() {
    let running = Running::start(EngineOptions::default());
    let engine = &running.engine;
    let prompt: Vec<u32> = (0..100).map(|i| 3000 + (i * 7919) % 20000).collect();
    let sampling =
        SamplingParams { n: 4, seed: Some(9), max_new_tokens: 3, ignore_eos: true, ..Default::default() };
    let mut outputs = collect(engine.generate(GenerateRequest {
        input_ids: Some(Prompts::One(prompt)),
        sampling,
        ..Default::default()
    }));
    outputs.sort_by_key(|o| o.index);
    assert_eq!(outputs.iter().map(|o| o.index).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(outputs[0].meta_info.cached_tokens, 0);
    for sample in &outputs[1..] {
        // The first sample's 6 full blocks of 16 tokens.
        assert_eq!(sample.meta_info.cached_tokens, 96, "sample {}", sample.index);
        assert_eq!(sample.output_ids.len(), 3);
    }
    assert_eq!(running.idle_metrics().kv_blocks_used, 0);
    running.finish();
}

#[test]
fn the_same_seed_gives_the_same_text_alone_and_in_a_batch() {
    let running = Running::start(EngineOptions::default());
    let engine = &running.engine;
    // Top-k: alone, the draw comes from the GPU's candidates; beside a neighbour that wants
    // logprobs, from the whole row read back. Both must draw the same tokens.
    let seeded = SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, seed: Some(1234), ..greedy(24) };
    let alone = only(engine.generate(request(PROMPTS[2], seeded.clone(), false)));
    let neighbours: Vec<GenerationStream> = (0..5)
        .map(|i| {
            let sampling = SamplingParams { temperature: 0.5 + 0.2 * i as f32, seed: Some(i), ..greedy(30) };
            let mut neighbour = request(PROMPTS[i as usize], sampling, false);
            neighbour.return_logprob = i == 0;
            engine.generate(neighbour)
        })
        .collect();
    let streamed = joined(collect(engine.generate(request(PROMPTS[2], seeded, true))));
    for neighbour in neighbours {
        only(neighbour);
    }
    assert_eq!(streamed.output_ids, alone.output_ids);
    assert_eq!(streamed.text, alone.text, "the stream's pieces concatenate to the whole text");
    assert_eq!(streamed.meta_info.finish_reason, alone.meta_info.finish_reason);
    running.finish();
}

#[test]
fn a_stop_string_split_across_tokens_is_found_and_cut() {
    let running = Running::start(EngineOptions::default());
    let engine = &running.engine;
    let free = only(engine.generate(request(PROMPTS[0], greedy(24), false)));
    // A stop string made of the end of one token's text and the start of the next one's.
    let tokenizer = engine.tokenizer();
    let pieces: Vec<String> =
        free.output_ids.iter().map(|&id| tokenizer.decode(&[id], true).unwrap()).collect();
    let at = (1..pieces.len() - 1)
        .find(|&i| pieces[i].trim().len() >= 2 && pieces[i + 1].trim().len() >= 2)
        .expect("two neighbouring tokens of at least two characters");
    let stop = format!("{}{}", &pieces[at][pieces[at].len() - 2..], &pieces[at + 1][..2]);
    let cut = &free.text[..free.text.find(&stop).unwrap()];
    let sampling = SamplingParams { stop: vec![stop.clone()], ..greedy(24) };
    let stopped = only(engine.generate(request(PROMPTS[0], sampling.clone(), false)));
    assert_eq!(stopped.text, cut, "stop string {stop:?}");
    assert_eq!(stopped.meta_info.finish_reason, Some(FinishReason::Stop { matched: StopMatch::Text(stop) }));
    let streamed = collect(engine.generate(request(PROMPTS[0], sampling, true)));
    assert!(streamed.len() > 2);
    assert_eq!(joined(streamed).text, cut, "the stream never emits the stop string");
    running.finish();
}

#[test]
fn a_full_kv_cache_preempts_and_recomputes_without_changing_outputs() {
    // 12 blocks of 16 tokens; four requests of up to 60 tokens each need 16.
    let running = Running::start(EngineOptions { kv_cache_tokens: Some(192), ..Default::default() });
    let engine = &running.engine;
    let sampling = SamplingParams { ignore_eos: true, ..greedy(48) };
    let alone: Vec<Vec<u32>> = PROMPTS[..4]
        .iter()
        .map(|p| only(engine.generate(request(p, sampling.clone(), false))).output_ids)
        .collect();
    let streams: Vec<GenerationStream> =
        PROMPTS[..4].iter().map(|p| engine.generate(request(p, sampling.clone(), false))).collect();
    let together: Vec<Vec<u32>> = streams.into_iter().map(|s| only(s).output_ids).collect();
    assert_eq!(together, alone);
    let metrics = running.idle_metrics();
    assert!(metrics.preemptions > 0, "{metrics:?}");
    assert_eq!(metrics.kv_blocks_used, 0);
    running.finish();
}

#[test]
fn invalid_requests_fail_before_anything_is_queued() {
    let running = Running::start(EngineOptions::default());
    let engine = &running.engine;
    let failure = |req: GenerateRequest| {
        let items = futures::executor::block_on(engine.generate(req).collect::<Vec<_>>());
        assert_eq!(items.len(), 1);
        items.into_iter().next().unwrap().unwrap_err().to_string()
    };
    let bad_top_p = SamplingParams { top_p: 0.0, ..Default::default() };
    assert!(failure(request("hi", bad_top_p, false)).contains("top_p"));
    let too_long = SamplingParams { max_new_tokens: 1_000_000, ..Default::default() };
    assert!(failure(request("hi", too_long, false)).contains("max_new_tokens"));
    // The largest values a JSON client can send are errors, not overflows.
    let most = SamplingParams { max_new_tokens: usize::MAX, ..Default::default() };
    assert!(failure(request("hi", most, false)).contains("max_new_tokens"));
    let samples = SamplingParams { n: usize::MAX, ..Default::default() };
    assert!(failure(request("hi", samples, false)).contains("'n'"));
    let out_of_vocab =
        GenerateRequest { input_ids: Some(Prompts::One(vec![1, 10_000_000])), ..Default::default() };
    assert!(failure(out_of_vocab).contains("10000000"));
    assert!(failure(GenerateRequest::default()).contains("text"));
    let empty = GenerateRequest { input_ids: Some(Prompts::One(vec![])), ..Default::default() };
    assert!(failure(empty).contains("no tokens"));
    let metrics = engine.metrics();
    assert_eq!((metrics.waiting_sequences, metrics.running_sequences, metrics.steps), (0, 0, 0));
    // A batch gives one output per prompt, each with its index.
    let batch = GenerateRequest {
        text: Some(Prompts::Batch(PROMPTS[..3].iter().map(|p| p.to_string()).collect())),
        sampling: greedy(4),
        ..Default::default()
    };
    let mut indices: Vec<usize> = collect(engine.generate(batch)).iter().map(|o| o.index).collect();
    indices.sort();
    assert_eq!(indices, [0, 1, 2]);
    running.finish();
}
