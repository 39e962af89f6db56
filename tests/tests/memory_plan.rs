//! The memory plan on the real SmolLM2: its figures against what the engine then holds, the KV
//! cache sized to a budget when no size is asked for, and models that do not fit refused before
//! anything is uploaded.

use std::sync::Arc;

use flint_core::Error;
use flint_core::engine::{Engine, EngineOptions, GenerateRequest, Prompts};
use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::model::{KV_BLOCK_TOKENS, MemoryPlan, MemorySource, Model};
use flint_core::sample::SamplingParams;
use flint_e2e::SMOLLM2;
use futures::StreamExt;
use futures::executor::block_on;

fn gpu_within(budget: Option<u64>) -> Arc<GpuContext> {
    block_on(GpuContext::new(&GpuOptions { memory_budget: budget, ..GpuOptions::from_env() }))
        .unwrap_or_else(|e| panic!("GPU tests need an adapter (they never skip): {e}"))
}

fn file() -> GgufFile {
    GgufFile::open(SMOLLM2.path()).unwrap()
}

/// Runs one greedy request of `prompt_tokens` tokens (each a word) and `new_tokens` more on
/// an engine of `options`, and returns the engine's KV capacity for one sequence.
fn run(ctx: Arc<GpuContext>, options: EngineOptions, prompt_words: usize, new_tokens: usize) -> usize {
    let (engine, step_loop) = Engine::load(ctx, &file(), options).unwrap();
    let handle = std::thread::spawn(move || block_on(step_loop.run()));
    let request = GenerateRequest {
        text: Some(Prompts::One("word ".repeat(prompt_words))),
        sampling: SamplingParams {
            temperature: 0.0,
            max_new_tokens: new_tokens,
            ignore_eos: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let outputs: Vec<_> = block_on(engine.generate(request).collect());
    for output in outputs {
        output.unwrap_or_else(|e| panic!("the request fails: {e}"));
    }
    let capacity = engine.max_sequence_tokens();
    drop(engine);
    handle.join().unwrap();
    capacity
}

#[test]
fn the_plan_bounds_what_the_engine_holds() {
    let ctx = gpu_within(None);
    let options = EngineOptions { kv_cache_tokens: Some(1024), ..Default::default() };
    let plan = MemoryPlan::new(&ctx, &file(), &options.plan_request()).unwrap();
    eprintln!("{plan}");
    assert_eq!(plan.kv_tokens, 1024);

    // The weights as uploaded, within 2% (the plan leaves out the weight textures' last rows).
    let model = Model::load(ctx.clone(), &file()).unwrap();
    let weights = ctx.memory_in_use() as f64;
    assert!((plan.weight_bytes as f64 / weights - 1.0).abs() < 0.02, "{} vs {weights}", plan.weight_bytes);
    // The KV cache exactly (the same pooled tensors).
    let cache = model.new_kv_cache(Some(plan.kv_tokens)).unwrap();
    assert_eq!(ctx.memory_in_use() as f64 - weights, plan.kv_bytes as f64);
    drop((cache, model));

    // A prompt of more than one full step (256 tokens) and a few decode steps stay within the
    // planned activations.
    let ctx = gpu_within(None);
    run(ctx.clone(), options, 300, 4);
    let held = plan.weight_bytes + plan.kv_bytes;
    let activations = ctx.memory_peak().saturating_sub(held);
    eprintln!("activations: at most {activations} bytes, planned {}", plan.activation_bytes);
    assert!(activations <= plan.activation_bytes, "{activations} > {}", plan.activation_bytes);
}

#[test]
fn without_a_size_the_kv_cache_gets_the_room_the_budget_leaves() {
    let unlimited =
        MemoryPlan::new(&gpu_within(None), &file(), &EngineOptions::default().plan_request()).unwrap();
    let per_token = unlimited.kv_bytes_per_token;
    // Room for the weights, a full step and about 600 tokens.
    let budget = unlimited.weight_bytes + unlimited.activation_bytes + 600 * per_token;
    let ctx = gpu_within(Some(budget));
    let plan = MemoryPlan::new(&ctx, &file(), &EngineOptions::default().plan_request()).unwrap();
    eprintln!("{plan}");
    assert_eq!(plan.available_from, Some(MemorySource::Budget));
    assert!(plan.total_bytes() <= budget);
    assert!(plan.kv_tokens.is_multiple_of(KV_BLOCK_TOKENS));
    // The most blocks that fit: one more would not (a layer's tensor is rounded up to the pool's
    // size classes, by at most an eighth, and padded on CPU devices).
    assert!(plan.kv_tokens >= 300, "{} tokens", plan.kv_tokens);
    let more =
        EngineOptions { kv_cache_tokens: Some(plan.kv_tokens + KV_BLOCK_TOKENS), ..Default::default() };
    let more = MemoryPlan::new(&ctx, &file(), &more.plan_request()).unwrap();
    assert!(more.total_bytes() > budget, "{more}");

    // The engine takes that size, and a request as long as it runs within the budget.
    let capacity = run(ctx.clone(), EngineOptions::default(), 300, 8);
    assert_eq!(capacity, plan.kv_tokens);
    assert!(ctx.memory_peak() <= budget);
}

#[test]
fn a_model_that_cannot_fit_fails_before_any_upload() {
    let unlimited =
        MemoryPlan::new(&gpu_within(None), &file(), &EngineOptions::default().plan_request()).unwrap();

    // A KV cache of the model's whole context past a budget that holds the weights.
    let budget = unlimited.weight_bytes + unlimited.activation_bytes + (64 << 20);
    let ctx = gpu_within(Some(budget));
    let options = EngineOptions { kv_cache_tokens: Some(8192), ..Default::default() };
    let error = Engine::load(ctx.clone(), &file(), options).err().expect("the load fails");
    let message = error.to_string();
    assert!(matches!(error, Error::DoesNotFit { .. }), "{message}");
    for expected in ["--ctx-size", "--gpu-memory-budget", "8192 tokens", "MiB"] {
        assert!(message.contains(expected), "{expected:?} missing from: {message}");
    }
    assert_eq!(ctx.memory_peak(), 0, "nothing was uploaded");

    // A KV cache past what one storage binding holds per layer, whatever the memory.
    let ctx = gpu_within(None);
    let options = EngineOptions { kv_cache_tokens: Some(unlimited.max_kv_tokens + 1), ..Default::default() };
    let message = Engine::load(ctx.clone(), &file(), options).err().expect("the load fails").to_string();
    assert!(message.contains("storage binding") && message.contains("--ctx-size"), "{message}");
    assert_eq!(ctx.memory_peak(), 0, "nothing was uploaded");
}
