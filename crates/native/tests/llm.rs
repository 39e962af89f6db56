//! The blocking facade with the real SmolLM2 model on the GPU: shared by many threads, streams
//! dropped early, errors from the engine, a panic on the engine thread, a lost GPU, shutdown.
//!
//! Each test loads its own `LLM` (they must not see each other's requests in the metrics), with
//! a small KV cache, and generates a few tokens only: lavapipe decodes about 10 tokens/s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_core::Error as CoreError;
use flint_core::engine::Fault;
use flint_e2e::SMOLLM2;
use flint_native::{
    EngineMetrics, EngineOptions, Error, FinishReason, GenerateOutput, GenerateRequest, LLM, LoadOptions,
    LoadStage, Prompts, SamplingParams,
};

fn load(engine: EngineOptions) -> LLM {
    LLM::load(SMOLLM2.path(), LoadOptions { engine, ..Default::default() })
        .unwrap_or_else(|e| panic!("loading SmolLM2 failed (GPU tests never skip): {e}"))
}

fn small_engine() -> EngineOptions {
    EngineOptions { kv_cache_tokens: Some(1024), ..Default::default() }
}

fn request(prompt: &str, max_new_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        text: Some(Prompts::One(prompt.into())),
        sampling: SamplingParams { temperature: 0.0, max_new_tokens, ..Default::default() },
        ..Default::default()
    }
}

/// Waits until nothing runs or waits; the metrics then.
fn idle_metrics(llm: &LLM) -> EngineMetrics {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let metrics = llm.metrics().unwrap();
        if metrics.running_sequences == 0 && metrics.waiting_sequences == 0 {
            return metrics;
        }
        assert!(Instant::now() < deadline, "the engine did not go idle: {metrics:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
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
fn eight_threads_share_one_llm_and_each_gets_what_it_gets_alone() {
    fn shareable<T: Send + Sync>() {}
    shareable::<LLM>();

    let stages = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = stages.clone();
    let on_progress = Box::new(move |stage| seen.lock().unwrap().push(stage));
    let llm = LLM::load(
        SMOLLM2.path(),
        LoadOptions { engine: small_engine(), on_progress: Some(on_progress), ..Default::default() },
    )
    .unwrap();
    let stages = stages.lock().unwrap().clone();
    assert_eq!(stages[..3], [LoadStage::ReadingFile, LoadStage::OpeningGpu, LoadStage::UploadingWeights]);
    assert_eq!(stages.last(), Some(&LoadStage::Ready));
    // Then the bytes uploaded, tensor by tensor, growing to the total.
    let uploaded: Vec<(u64, u64)> = stages[3..stages.len() - 1]
        .iter()
        .map(|stage| match *stage {
            LoadStage::WeightsUploaded { bytes, total } => (bytes, total),
            other => panic!("{other:?} among the uploads"),
        })
        .collect();
    assert!(uploaded.len() > 100, "SmolLM2's 272 tensors: {} reports", uploaded.len());
    assert!(uploaded.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 == pair[1].1));
    let (bytes, total) = *uploaded.last().unwrap();
    assert_eq!(bytes, total);
    assert!(total > 90_000_000 && total <= SMOLLM2.path().metadata().unwrap().len());
    let alone: Vec<GenerateOutput> = PROMPTS.iter().map(|p| llm.generate(request(p, 6)).unwrap()).collect();
    let together: Vec<(GenerateOutput, String)> = std::thread::scope(|scope| {
        let threads: Vec<_> = PROMPTS
            .iter()
            .enumerate()
            .map(|(i, prompt)| {
                let llm = &llm;
                scope.spawn(move || {
                    // Half the threads stream, half wait for the whole output.
                    if i % 2 == 0 {
                        (llm.generate(request(prompt, 6)).unwrap(), String::new())
                    } else {
                        let items: Vec<GenerateOutput> =
                            llm.generate_stream(request(prompt, 6)).map(Result::unwrap).collect();
                        let text = items.iter().map(|item| item.text.as_str()).collect();
                        (items.last().unwrap().clone(), text)
                    }
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (i, ((output, streamed_text), alone)) in together.iter().zip(&alone).enumerate() {
        if i % 2 == 0 {
            assert_eq!(output.output_ids, alone.output_ids, "{}", PROMPTS[i]);
            assert_eq!(output.text, alone.text);
        } else {
            assert_eq!(streamed_text, &alone.text, "{}", PROMPTS[i]);
        }
        assert!(output.meta_info.finish_reason.is_some());
    }
    assert_eq!(idle_metrics(&llm).kv_blocks_used, 0);
}

#[test]
fn requests_run_in_submission_order() {
    // One sequence at a time: the first request submitted runs first and fills the prefix
    // cache with the shared 40-token prompt; the second finds it there.
    let llm = load(EngineOptions { max_running: 1, ..small_engine() });
    let prompt: Vec<u32> = (0..40).map(|i| 1000 + i * 37).collect();
    let ids = |_| GenerateRequest {
        input_ids: Some(Prompts::One(prompt.clone())),
        sampling: SamplingParams { temperature: 0.0, max_new_tokens: 1, ..Default::default() },
        ..Default::default()
    };
    let first = llm.generate_stream(ids(0));
    let second = llm.generate_stream(ids(1));
    // Read in the opposite order: the order of submission decides, not the order of reading.
    let second: Vec<GenerateOutput> = second.map(Result::unwrap).collect();
    let first: Vec<GenerateOutput> = first.map(Result::unwrap).collect();
    assert_eq!(first.last().unwrap().meta_info.cached_tokens, 0);
    assert_eq!(second.last().unwrap().meta_info.cached_tokens, 32);
}

#[test]
fn dropping_a_stream_early_aborts_its_request_and_frees_its_blocks() {
    let llm = load(small_engine());
    let mut long = request(PROMPTS[2], 200);
    long.sampling.ignore_eos = true;
    let mut stream = llm.generate_stream(long);
    for _ in 0..2 {
        let item = stream.next().unwrap().unwrap();
        assert!(item.meta_info.finish_reason.is_none());
    }
    assert!(llm.metrics().unwrap().kv_blocks_used > 0);
    drop(stream);
    let metrics = idle_metrics(&llm);
    assert_eq!(metrics.kv_blocks_used, 0, "{metrics:?}");
    // Aborted, not drained to its 200 tokens.
    assert!(metrics.generated_tokens < 100, "{metrics:?}");
    // The engine goes on serving.
    assert_eq!(llm.generate(request(PROMPTS[0], 2)).unwrap().meta_info.completion_tokens, 2);
}

#[test]
fn errors_raised_in_the_engine_reach_the_caller() {
    let llm = load(small_engine());
    let mut bad = request(PROMPTS[0], 4);
    bad.sampling.top_p = 0.0;
    let error = llm.generate(bad.clone()).unwrap_err();
    assert!(matches!(error, Error::Core(_)) && error.to_string().contains("top_p"), "{error}");
    let mut items = llm.generate_stream(bad);
    let error = items.next().unwrap().unwrap_err();
    assert!(error.to_string().contains("top_p"), "{error}");
    assert!(items.next().is_none());

    let too_long = request(PROMPTS[0], 5000);
    assert!(llm.generate(too_long).unwrap_err().to_string().contains("max_new_tokens"));
    let batch = GenerateRequest {
        text: Some(Prompts::Batch(vec!["a".into(), "b".into()])),
        sampling: SamplingParams { temperature: 0.0, max_new_tokens: 2, ..Default::default() },
        ..Default::default()
    };
    assert!(matches!(llm.generate(batch.clone()), Err(Error::ManyOutputs { outputs: 2 })));
    let indices: Vec<usize> = llm.generate_all(batch).unwrap().iter().map(|o| o.index).collect();
    assert_eq!(indices, [0, 1]);

    // Any engine call through run; a blocking call from inside it is an error, not a deadlock.
    let stats = llm.run(|engine| async move { engine.flush_cache().await.map(|()| engine.metrics()) });
    assert_eq!(stats.unwrap().unwrap().kv_blocks_cached, 0);
    let shared = Arc::new(llm);
    let inside = shared.clone();
    let nested = shared.run(move |_| async move { inside.generate(request("x", 1)).map(|_| ()) }).unwrap();
    assert!(matches!(nested, Err(Error::OnEngineThread)), "{nested:?}");

    let missing = LLM::load("/nonexistent/model.gguf", LoadOptions::default()).err().unwrap();
    assert!(missing.to_string().contains("/nonexistent/model.gguf"), "{missing}");
}

#[test]
fn a_panic_on_the_engine_thread_fails_every_waiting_caller() {
    let llm = load(small_engine());
    let mut long = request(PROMPTS[3], 200);
    long.sampling.ignore_eos = true;
    let mut stream = llm.generate_stream(long.clone());
    stream.next().unwrap().unwrap();
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| llm.generate(long));
        // Once the second request runs too, a future on the engine thread panics.
        while llm.metrics().unwrap().running_sequences < 2 {
            std::thread::sleep(Duration::from_millis(10));
        }
        let panicked = llm.run(|_| async { panic!("injected by the test") });
        assert!(
            matches!(&panicked, Err(Error::EnginePanicked { message }) if message == "injected by the test"),
            "{panicked:?}"
        );
        let waited = waiting.join().unwrap();
        assert!(matches!(waited, Err(Error::EnginePanicked { .. })), "{waited:?}");
    });
    // The stream yields the error (after any items already sent), then ends.
    let rest: Vec<_> = stream.by_ref().collect();
    assert!(matches!(rest.last(), Some(Err(Error::EnginePanicked { .. }))), "{rest:?}");
    assert!(stream.next().is_none());
    assert!(matches!(llm.generate(request("x", 1)), Err(Error::EnginePanicked { .. })));
    assert!(matches!(llm.metrics(), Err(Error::EnginePanicked { .. })));
    llm.shutdown();
}

#[test]
fn a_lost_gpu_makes_the_llm_unhealthy_until_the_model_is_loaded_again() {
    let llm = load(small_engine());
    let mut long = request(PROMPTS[2], 200);
    long.sampling.ignore_eos = true;
    let mut stream = llm.generate_stream(long);
    stream.next().unwrap().unwrap();
    llm.run(|engine| async move { engine.inject_fault(Fault::DestroyDevice) }).unwrap();
    // The request in flight ends with an error, never a hang.
    let rest: Vec<_> = stream.collect();
    assert!(matches!(rest.last(), Some(Err(Error::Core(_)))), "{rest:?}");
    let unhealthy = llm.health().unwrap_err();
    assert!(matches!(unhealthy, Error::Core(CoreError::Unhealthy(_))), "{unhealthy}");
    assert!(!llm.metrics().unwrap().healthy);
    let refused = llm.generate(request("x", 1)).unwrap_err();
    assert!(refused.to_string().contains("load the model again"), "{refused}");
    llm.shutdown();

    let reloaded = load(small_engine());
    assert!(reloaded.health().is_ok());
    assert_eq!(reloaded.generate(request(PROMPTS[0], 2)).unwrap().meta_info.completion_tokens, 2);
}

#[test]
fn shutdown_twice_then_every_call_fails() {
    let llm = load(small_engine());
    let mut long = request(PROMPTS[4], 200);
    long.sampling.ignore_eos = true;
    let mut stream = llm.generate_stream(long);
    stream.next().unwrap().unwrap();
    llm.shutdown();
    llm.shutdown();
    // The stream in flight ends with the reason, never a hang.
    let rest: Vec<_> = stream.collect();
    assert!(matches!(rest.last(), Some(Err(Error::ShutDown))), "{rest:?}");
    assert!(matches!(llm.generate(request("x", 1)), Err(Error::ShutDown)));
    let items: Vec<_> = llm.generate_stream(request("x", 1)).collect();
    assert!(matches!(&items[..], [Err(Error::ShutDown)]), "{items:?}");
    assert!(matches!(llm.run(|_| async {}), Err(Error::ShutDown)));
    assert!(matches!(llm.metrics(), Err(Error::ShutDown)));
    assert!(matches!(llm.engine(), Err(Error::ShutDown)));
    // What needs no engine still works.
    assert!(!llm.tokenizer().encode("hello", false, false).is_empty());
    drop(llm);
}

#[test]
fn the_chat_template_turns_a_conversation_into_prompt_tokens() {
    let llm = load(small_engine());
    // The KV cache (1024 tokens) holds less than SmolLM2's context (8192).
    assert_eq!(llm.max_sequence_tokens(), 1024);
    let ids = llm.encode_chat(&[flint_native::ChatMessage::user("Hi!")]).unwrap();
    let text = llm.tokenizer().decode(&ids, false).unwrap();
    assert!(text.starts_with("<|im_start|>") && text.ends_with("<|im_start|>assistant\n"), "{text:?}");
    let answer = llm
        .generate(GenerateRequest {
            input_ids: Some(Prompts::One(ids)),
            sampling: SamplingParams { temperature: 0.0, max_new_tokens: 3, ..Default::default() },
            ..Default::default()
        })
        .unwrap();
    assert!(matches!(answer.meta_info.finish_reason, Some(FinishReason::Length { length: 3 })));
}

#[test]
fn a_chat_template_given_at_load_replaces_the_files_and_a_bad_one_fails_the_load() {
    let template = "{% for m in messages %}{{ bos_token }}[{{ m.role }}] {{ m.content }}{{ eos_token }}\n\
                    {% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
    let llm = LLM::load(
        SMOLLM2.path(),
        LoadOptions { engine: small_engine(), chat_template: Some(template.into()), ..Default::default() },
    )
    .unwrap();
    let messages = [flint_native::ChatMessage::system("Be brief."), flint_native::ChatMessage::user("Hi!")];
    let ids = llm.encode_chat(&messages).unwrap();
    let tokenizer = llm.tokenizer();
    let special = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id)).unwrap().to_string();
    let (bos, eos) = (special(tokenizer.bos()), special(tokenizer.eos()));
    assert!(!bos.is_empty() && !eos.is_empty(), "{bos:?} {eos:?}");
    // The template writes the BOS itself: none is added before it.
    let expected = format!("{bos}[system] Be brief.{eos}\n{bos}[user] Hi!{eos}\n[assistant] ");
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), expected);
    drop(llm);

    let bad = LLM::load(
        SMOLLM2.path(),
        LoadOptions {
            engine: small_engine(),
            chat_template: Some("{% for m in messages %}{{ m.content }}".into()),
            ..Default::default()
        },
    );
    match bad {
        Err(Error::Core(CoreError::ChatTemplate(why))) => {
            let file = SMOLLM2.path().display().to_string();
            assert!(why.contains("does not compile") && why.contains(&file), "{why}");
        }
        Err(other) => panic!("a template that does not compile fails the load with another error: {other}"),
        Ok(_) => panic!("a template that does not compile was accepted"),
    }
}
