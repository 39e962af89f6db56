//! Faults on the real SmolLM2 engine: a panic in the forward pass or in a sampler fails only
//! the requests it touches and the engine goes on; a GPU device lost mid-request fails the
//! requests, marks the engine unhealthy and refuses new ones, and the model loads again on a
//! new device; a KV cache too small for a request is an error before anything is queued; a
//! step that would take GPU memory past the budget fails its requests and the engine goes on.
//!
//! Panics and device loss are injected with `Engine::inject_fault` (flint-core's
//! `fault-injection` feature) or, where the test holds the device, `wgpu::Device::destroy`.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flint_core::Error;
use flint_core::engine::{
    Engine, EngineMetrics, EngineOptions, Fault, FinishReason, GenerateOutput, GenerateRequest,
    GenerationStream, Prompts,
};
use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::sample::SamplingParams;
use flint_e2e::SMOLLM2;
use futures::StreamExt;
use futures::executor::block_on;

/// A device of its own for each test (one test destroys its device), within `budget` bytes.
fn gpu_within(budget: Option<u64>) -> Arc<GpuContext> {
    block_on(GpuContext::new(&GpuOptions { memory_budget: budget, ..GpuOptions::from_env() }))
        .unwrap_or_else(|e| panic!("GPU tests need an adapter (they never skip): {e}"))
}

fn gpu() -> Arc<GpuContext> {
    gpu_within(None)
}

/// An engine on `ctx`, its step loop on a thread of its own, or the load's error.
fn try_start(ctx: Arc<GpuContext>, options: EngineOptions) -> flint_core::Result<(Engine, JoinHandle<()>)> {
    let file = GgufFile::open(SMOLLM2.path()).unwrap();
    let (engine, step_loop) = Engine::load(ctx, &file, options)?;
    Ok((engine, std::thread::spawn(move || block_on(step_loop.run()))))
}

fn start(ctx: Arc<GpuContext>, options: EngineOptions) -> (Engine, JoinHandle<()>) {
    try_start(ctx, options).unwrap()
}

/// Once the engine is idle: no KV block is held and the engine is healthy; then it stops, and
/// its step loop ends without having panicked.
fn stop_healthy(engine: Engine, step_loop: JoinHandle<()>) {
    let metrics = idle_metrics(&engine);
    assert_eq!(metrics.kv_blocks_used, 0, "{metrics:?}");
    assert!(metrics.healthy && engine.health().is_ok(), "{metrics:?}");
    drop(engine);
    step_loop.join().expect("the step loop survives the panic");
}

fn request(rid: &str, prompt: &str, max_new_tokens: usize, stream: bool) -> GenerateRequest {
    GenerateRequest {
        text: Some(Prompts::One(prompt.into())),
        sampling: SamplingParams { temperature: 0.0, max_new_tokens, ignore_eos: true, ..Default::default() },
        stream,
        rid: Some(rid.into()),
        ..Default::default()
    }
}

fn collect(stream: GenerationStream) -> Vec<Result<GenerateOutput, Error>> {
    block_on(stream.collect::<Vec<_>>())
}

fn output_ids(items: Vec<Result<GenerateOutput, Error>>) -> Vec<u32> {
    let mut ids = Vec::new();
    for item in items {
        ids.extend(item.unwrap_or_else(|e| panic!("request failed: {e}")).output_ids);
    }
    ids
}

fn idle_metrics(engine: &Engine) -> EngineMetrics {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let metrics = engine.metrics();
        if metrics.running_sequences == 0 && metrics.waiting_sequences == 0 {
            return metrics;
        }
        assert!(Instant::now() < deadline, "the engine did not go idle: {metrics:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The error a stream ended with, after any items.
fn final_error(items: &[Result<GenerateOutput, Error>]) -> &Error {
    match items.last() {
        Some(Err(error)) => error,
        other => panic!("the stream did not end with an error: {other:?}"),
    }
}

#[test]
fn a_panic_in_the_sampler_fails_its_request_and_the_others_go_on() {
    let (engine, step_loop) = start(gpu(), EngineOptions::default());
    let prompts = ["The capital of France is", "Water boils at a temperature of"];
    let alone = output_ids(collect(engine.generate(request("alone", prompts[1], 12, false))));

    let mut doomed = engine.generate(request("doomed", prompts[0], 200, true));
    block_on(doomed.next()).unwrap().unwrap();
    let survivor = engine.generate(request("survivor", prompts[1], 12, false));
    engine.inject_fault(Fault::PanicWhileSampling("doomed".into()));
    let doomed: Vec<_> = block_on(doomed.collect());
    let error = final_error(&doomed).to_string();
    assert!(error.contains("sampling panicked") && error.contains("fault injected"), "{error}");
    assert_eq!(output_ids(collect(survivor)), alone, "the other request is not disturbed");
    stop_healthy(engine, step_loop);
}

#[test]
fn a_panic_in_the_forward_pass_fails_that_step_and_the_engine_goes_on() {
    let (engine, step_loop) = start(gpu(), EngineOptions::default());
    let mut running = engine.generate(request("running", "Once upon a time,", 200, true));
    block_on(running.next()).unwrap().unwrap();
    engine.inject_fault(Fault::PanicInForwardPass);
    let rest: Vec<_> = block_on(running.collect());
    let error = final_error(&rest);
    assert!(matches!(error, Error::StepFailed(_)), "{error}");
    assert!(error.to_string().contains("panicked: fault injected"), "{error}");

    // Later requests are served as if nothing happened.
    let after = collect(engine.generate(request("after", "The capital of France is", 4, false)));
    assert_eq!(output_ids(after).len(), 4);
    stop_healthy(engine, step_loop);
}

#[test]
fn a_lost_device_fails_its_requests_and_the_model_loads_again_on_a_new_one() {
    let ctx = gpu();
    let (engine, step_loop) = start(ctx.clone(), EngineOptions::default());
    let mut running = engine.generate(request("running", "Once upon a time,", 200, true));
    block_on(running.next()).unwrap().unwrap();
    ctx.device().destroy();
    let rest: Vec<_> = block_on(running.collect());
    let error = final_error(&rest);
    assert!(matches!(error, Error::Unhealthy(_) | Error::StepFailed(_)), "{error}");

    // Unhealthy from now on: said by health and the metrics, and new requests are refused.
    let unhealthy = engine.health().unwrap_err();
    assert!(matches!(unhealthy, Error::Unhealthy(_)), "{unhealthy}");
    assert!(unhealthy.to_string().contains("load the model again"), "{unhealthy}");
    let refused = collect(engine.generate(request("refused", "Hi", 2, false)));
    assert!(matches!(&refused[..], [Err(Error::Unhealthy(_))]), "{refused:?}");
    assert!(!idle_metrics(&engine).healthy);
    drop(engine);
    step_loop.join().expect("the step loop ends without a panic");

    // Loaded again on a new device, the model serves.
    let (engine, step_loop) = start(gpu(), EngineOptions::default());
    let again = collect(engine.generate(request("again", "The capital of France is", 3, false)));
    assert_eq!(output_ids(again).len(), 3);
    assert!(engine.health().is_ok());
    drop(engine);
    step_loop.join().unwrap();
}

#[test]
fn a_kv_cache_too_small_for_a_request_refuses_it_and_serves_what_fits() {
    // Two blocks of 16 tokens.
    let (engine, step_loop) = start(gpu(), EngineOptions { kv_cache_tokens: Some(32), ..Default::default() });
    let too_big = collect(engine.generate(request("big", "The capital of France is", 40, false)));
    let error = match &too_big[..] {
        [Err(error)] => error.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(error.contains("max_new_tokens") && error.contains("KV cache of 32 tokens"), "{error}");
    let fits = collect(engine.generate(request("fits", "The capital of France is", 8, false)));
    assert!(matches!(
        fits[0].as_ref().unwrap().meta_info.finish_reason,
        Some(FinishReason::Length { length: 8 })
    ));
    drop(engine);
    step_loop.join().unwrap();
}

#[test]
fn a_step_past_the_memory_budget_fails_its_requests_and_the_engine_goes_on() {
    let options = EngineOptions { kv_cache_tokens: Some(512), ..Default::default() };
    let long_prompt = "Once upon a time, in a land far away, there lived a king. ".repeat(16);
    let short_prompt = "The capital of France is";

    // Without a budget: what the weights and KV cache hold, and the most each request's steps add.
    let ctx = gpu();
    let (engine, step_loop) = start(ctx.clone(), options.clone());
    let loaded = ctx.memory_in_use();
    let short_ids = output_ids(collect(engine.generate(request("short", short_prompt, 4, false))));
    let short_peak = ctx.memory_peak() - loaded;
    collect(engine.generate(request("long", &long_prompt, 2, false)));
    let long_peak = ctx.memory_peak() - loaded;
    assert_eq!(idle_metrics(&engine).kv_blocks_used, 0);
    assert_eq!(ctx.memory_in_use(), loaded, "a finished request's activations are freed");
    eprintln!(
        "loaded: {loaded} bytes; steps add at most {short_peak} (short request), {long_peak} (long prompt)"
    );
    // Far enough apart that a budget half-way holds the one and refuses the other (the short
    // request's overlapped steps hold a step's logits while the next is recorded).
    assert!(long_peak > 3 * short_peak, "the long prompt's prefill needs more: {long_peak} vs {short_peak}");
    drop(engine);
    step_loop.join().unwrap();

    // A budget that holds the short request's steps but not the long prompt's prefill.
    let budget = loaded + (short_peak + long_peak) / 2;
    let ctx = gpu_within(Some(budget));
    let (engine, step_loop) = start(ctx.clone(), options.clone());
    let refused = collect(engine.generate(request("long", &long_prompt, 2, false)));
    let error = final_error(&refused);
    assert!(matches!(error, Error::StepFailed(_)), "{error}");
    assert!(error.to_string().contains("out of GPU memory"), "{error}");
    assert!(error.to_string().contains(&format!("the budget is {budget}")), "{error}");

    // Nothing is held of the failed step; the engine stays healthy and serves what fits, the
    // same tokens as without a budget.
    let after = output_ids(collect(engine.generate(request("short", short_prompt, 4, false))));
    assert_eq!(after, short_ids);
    let metrics = idle_metrics(&engine);
    assert!(metrics.healthy && engine.health().is_ok(), "{metrics:?}");
    assert_eq!(metrics.kv_blocks_used, 0, "{metrics:?}");
    assert_eq!(ctx.memory_in_use(), loaded);
    assert!(ctx.memory_peak() <= budget);
    drop(engine);
    step_loop.join().unwrap();

    // A budget the weights do not fit in fails the load before anything is uploaded (the memory
    // plan), with the plan's figures.
    let ctx = gpu_within(Some(loaded / 2));
    let error = try_start(ctx.clone(), options).err().expect("the load fails");
    assert!(matches!(error, Error::DoesNotFit { .. }), "{error}");
    assert!(
        error.to_string().contains("raise the budget") && error.to_string().contains("weights"),
        "{error}"
    );
    assert_eq!(ctx.memory_peak(), 0, "nothing was uploaded");
}
