//! Embeddings ([`Engine::embed`]) of the tiny models against llama.cpp's
//! (`tests/fixtures/tiny_models/embeddings.json`, scripts/fixtures/make_llama_embeddings.py):
//! tiny-qwen2-q8_0, whose file says nothing of pooling (the mean), and tiny-qwen3-embedding,
//! which pools the last token as Qwen3-Embedding does; inputs of 11 to 240 tokens, run whole and
//! in passes of 16 tokens, alone and while the engine generates.
//!
//! The bounds: both engines keep the KV cache in f16, but llama.cpp's CPU backend also rounds
//! the input of every quantized matmul to 8 bits (Q8_0), where flint multiplies in f32 (it
//! equals an exact f64 pass, `crates/core/src/model/tests.rs`). One token's state, as last-token
//! pooling takes it, then differs by up to 6e-3 in a component of typical size 0.06 (cosine
//! 0.9997 on these inputs, measured); the mean over many tokens averages that down to 1.4e-3
//! (cosine 0.99997). So: mean pooling within 2e-3 per component and a cosine above 0.9999;
//! one token's state within 1e-2 and above 0.9995. A wrong pooling, norm or position is off
//! by a tenth or more.

use std::sync::{Arc, OnceLock};

use flint_core::engine::{Engine, EngineOptions, GenerateRequest, Prompts};
use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::model::Pooling;
use flint_core::sample::SamplingParams;
use flint_e2e::{repo_root, tiny_model_dir};
use futures::StreamExt;
use serde::Deserialize;

/// (largest component difference, smallest cosine) against llama.cpp, by pooling.
fn bounds(pooling: Pooling) -> (f32, f64) {
    match pooling {
        Pooling::Mean => (2e-3, 0.9999),
        Pooling::First | Pooling::Last => (1e-2, 0.9995),
    }
}

#[derive(Deserialize)]
struct Fixture {
    models: Vec<ModelRecord>,
}

#[derive(Deserialize)]
struct ModelRecord {
    model_file: String,
    sha256: String,
    pooling: String,
    inputs: Vec<Input>,
}

#[derive(Deserialize)]
struct Input {
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn gpu() -> Arc<GpuContext> {
    static GPU: OnceLock<Arc<GpuContext>> = OnceLock::new();
    GPU.get_or_init(|| {
        pollster::block_on(GpuContext::new(&GpuOptions::from_env()))
            .unwrap_or_else(|e| panic!("GPU tests need an adapter (they never skip): {e}"))
    })
    .clone()
}

fn fixture() -> Fixture {
    let path = repo_root().join("tests/fixtures/tiny_models/embeddings.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// An engine on `record`'s model with its step loop on a thread. make_tiny_models.sh checks
/// each file against the sha256 of its own fixture; llama.cpp read a file of that sha256.
fn engine(record: &ModelRecord, step_token_budget: usize) -> (Engine, std::thread::JoinHandle<()>) {
    #[derive(Deserialize)]
    struct Made {
        sha256: String,
    }
    let made =
        repo_root().join("tests/fixtures/tiny_models").join(record.model_file.replace(".gguf", ".json"));
    let made: Made = serde_json::from_str(&std::fs::read_to_string(&made).unwrap()).unwrap();
    assert_eq!(
        made.sha256, record.sha256,
        "llama.cpp's embeddings of {} were made on another file",
        record.model_file
    );
    let file = GgufFile::open(tiny_model_dir().join(&record.model_file)).unwrap();
    let options = EngineOptions { step_token_budget, max_running: 4, ..Default::default() };
    let (engine, step_loop) = Engine::load(gpu(), &file, options).unwrap();
    (engine, std::thread::spawn(move || futures::executor::block_on(step_loop.run())))
}

fn compare(what: &str, pooling: Pooling, got: &[f32], expected: &[f32]) {
    let (component_bound, cosine_bound) = bounds(pooling);
    assert_eq!(got.len(), expected.len(), "{what}: width");
    let norm: f64 = got.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{what}: |v| = {norm}");
    let cosine: f64 = got.iter().zip(expected).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
    let worst = got.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    eprintln!("{what}: cosine {cosine:.7}, largest component difference {worst:.2e}");
    assert!(cosine > cosine_bound && worst <= component_bound, "{what}: cosine {cosine}, worst {worst}");
}

#[test]
fn embeddings_match_llama_cpp_whole_and_in_passes() {
    for record in fixture().models {
        let pooling = if record.pooling == "mean" { Pooling::Mean } else { Pooling::Last };
        let inputs: Vec<Vec<u32>> = record.inputs.iter().map(|input| input.ids.clone()).collect();
        for budget in [256, 16] {
            let (engine, step_loop) = engine(&record, budget);
            let file_pooling = GgufFile::open(tiny_model_dir().join(&record.model_file))
                .ok()
                .and_then(|file| flint_core::model::ModelConfig::from_gguf(&file).ok())
                .map(|config| config.pooling);
            assert_eq!(file_pooling, Some(pooling), "{}", record.model_file);
            let embeddings = futures::executor::block_on(engine.embed(inputs.clone())).unwrap();
            assert_eq!(embeddings.prompt_tokens, inputs.iter().map(Vec::len).sum::<usize>());
            for (index, (got, input)) in embeddings.vectors.iter().zip(&record.inputs).enumerate() {
                let what = format!(
                    "{} input {index} ({} tokens, passes of {budget})",
                    record.model_file,
                    input.ids.len()
                );
                compare(&what, pooling, got, &input.embedding);
            }
            drop(engine);
            step_loop.join().unwrap();
        }
    }
}

#[test]
fn embeddings_run_beside_generation_and_bad_inputs_are_named() {
    let record = fixture().models.remove(0);
    let (engine, step_loop) = engine(&record, 16);
    // A stream generating while inputs are embedded between its steps.
    let request = GenerateRequest {
        input_ids: Some(Prompts::One(vec![5, 6, 7])),
        sampling: SamplingParams {
            temperature: 0.0,
            max_new_tokens: 24,
            ignore_eos: true,
            ..Default::default()
        },
        stream: true,
        ..Default::default()
    };
    let stream = engine.generate(request);
    let inputs: Vec<Vec<u32>> = record.inputs.iter().map(|input| input.ids.clone()).collect();
    let (embeddings, outputs) =
        futures::executor::block_on(futures::future::join(engine.embed(inputs), stream.collect::<Vec<_>>()));
    let embeddings = embeddings.unwrap();
    for (index, (got, input)) in embeddings.vectors.iter().zip(&record.inputs).enumerate() {
        compare(&format!("beside generation, input {index}"), Pooling::Mean, got, &input.embedding);
    }
    let generated: usize = outputs.into_iter().map(|item| item.unwrap().output_ids.len()).sum();
    assert_eq!(generated, 24);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine.metrics().kv_blocks_used != 0 {
        assert!(std::time::Instant::now() < deadline, "blocks still used: {:?}", engine.metrics());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let error =
        |inputs: Vec<Vec<u32>>| futures::executor::block_on(engine.embed(inputs)).unwrap_err().to_string();
    assert!(error(vec![]).contains("nothing to embed"));
    assert!(error(vec![vec![1], vec![]]).contains("input 1 is empty"));
    assert!(error(vec![vec![1; 257]]).contains("input 0 has 257 tokens"), "{}", error(vec![vec![1; 257]]));
    assert!(error(vec![vec![99_999]]).contains("token id 99999"));
    drop(engine);
    step_loop.join().unwrap();
}
