//! Synthetic models: their shapes have the real models' parameter counts, and a generated file
//! loads, tokenizes and runs in flint.

use std::sync::Arc;

use super::*;
use crate::gguf::{GgufFile, GgufWriter};
use crate::gpu::{GpuContext, GpuOptions};
use crate::model::{LogitRows, Model, ModelConfig, SequenceChunk};
use crate::tokenizer::Tokenizer;

#[test]
fn shapes_have_the_parameter_counts_of_the_real_models() {
    // From the models' published safetensors (embedding counted once when tied).
    let published = [
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.1-8b", 8_030_261_248),
        ("smollm2-135m", 134_515_008),
        ("qwen2.5-0.5b", 494_032_768),
        ("qwen2.5-7b", 7_615_616_512),
        ("gemma-3-1b", 999_885_952),
    ];
    for (name, parameters) in published {
        assert_eq!(shape(name).unwrap().parameters(), parameters, "{name}");
    }
    assert!(shape("gpt-5").unwrap_err().to_string().contains("llama-3.2-1b"));
    assert!(QuantMix::from_name("q3_k").unwrap_err().to_string().contains("q4_k_m"));
}

#[test]
fn q4_k_m_follows_llama_cpp_type_choices() {
    let shape = shape("llama-3.1-8b").unwrap();
    let tensors = shape.tensors(QuantMix::Q4KM);
    let quant = |name: &str| tensors.iter().find(|t| t.name == name).unwrap().quant;
    assert_eq!(quant("output.weight"), QuantType::Q6K);
    assert_eq!(quant("blk.0.attn_v.weight"), QuantType::Q6K);
    assert_eq!(quant("blk.4.attn_v.weight"), QuantType::Q4K);
    assert_eq!(quant("blk.6.ffn_down.weight"), QuantType::Q6K);
    assert_eq!(quant("blk.31.ffn_down.weight"), QuantType::Q6K);
    assert_eq!(quant("blk.10.ffn_up.weight"), QuantType::Q4K);
    // 4.9 GB, as llama.cpp's Llama-3.1-8B Q4_K_M file.
    let gigabytes = shape.data_bytes(QuantMix::Q4KM) as f64 / 1e9;
    assert!((4.6..5.0).contains(&gigabytes), "{gigabytes} GB");
    // A tied embedding is typed as the output; 0.81 GB as llama.cpp's Llama-3.2-1B Q4_K_M.
    let tied = shape_named("llama-3.2-1b");
    assert_eq!(tied.tensors(QuantMix::Q4KM)[0].quant, QuantType::Q6K);
    let gigabytes = tied.data_bytes(QuantMix::Q4KM) as f64 / 1e9;
    assert!((0.78..0.83).contains(&gigabytes), "{gigabytes} GB");
    // Rows K-quants do not divide fall back as llama.cpp's do (SmolLM2's 576).
    let small = shape_named("smollm2-135m").tensors(QuantMix::Q4KM);
    assert_eq!(small.iter().find(|t| t.name == "blk.5.attn_q.weight").unwrap().quant, QuantType::Q5_0);
}

fn shape_named(name: &str) -> &'static ModelShape {
    shape(name).unwrap()
}

#[test]
fn a_synthetic_model_loads_tokenizes_and_runs() {
    let shape = shape_named("smollm2-135m");
    let mut bytes = Vec::new();
    let mut last = (0, 0);
    write_model(shape, QuantMix::Q4_0, 3, &mut bytes, |written, total| last = (written, total)).unwrap();
    assert_eq!(last.0, last.1);
    assert_eq!(last.0 as usize, shape.data_bytes(QuantMix::Q4_0));
    // The same seed writes the same file.
    let mut again = Vec::new();
    write_model(shape, QuantMix::Q4_0, 3, &mut again, |_, _| {}).unwrap();
    assert!(bytes == again);

    let file = GgufFile::from_bytes(bytes).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!((config.n_layers, config.hidden, config.vocab_size), (30, 576, 49_152));
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let text = "Synthetic models, of real shapes: 135M parameters!";
    let ids = tokenizer.encode(text, false, false);
    assert!(ids.len() < text.len(), "merges apply: {} tokens", ids.len());
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);

    let ctx: Arc<GpuContext> = pollster::block_on(GpuContext::new(&GpuOptions::from_env())).unwrap();
    let model = Model::load(ctx.clone(), &file).unwrap();
    let mut cache = model.new_kv_cache(Some(64)).unwrap();
    let mut table = cache.new_sequence();
    cache.append(&mut table, ids.len()).unwrap();
    let chunk = SequenceChunk { table: &table, tokens: &ids, first_position: 0, logits: LogitRows::All };
    let logits = pollster::block_on(model.forward(&cache, &[chunk]).unwrap().to_f32(&ctx)).unwrap();
    assert!(logits.iter().all(|l| l.is_finite()));
    let row = &logits[..config.vocab_size];
    let mean = row.iter().map(|&l| f64::from(l)).sum::<f64>() / row.len() as f64;
    let std = (row.iter().map(|&l| (f64::from(l) - mean).powi(2)).sum::<f64>() / row.len() as f64).sqrt();
    // Normed hidden states against weights of deviation 0.02 over 576 columns: ~0.5.
    assert!((0.1..3.0).contains(&std), "logits' standard deviation {std}");
    cache.release(table);
}

#[test]
fn synthetic_vocabularies_tokenize_any_text_and_give_it_back() {
    for name in ["gemma-3-1b", "llama-3.2-1b"] {
        let shape = shape_named(name);
        let mut writer = GgufWriter::new(3);
        for (key, value) in shape.metadata(QuantMix::Q8_0, 5) {
            writer = writer.metadata(&key, value);
        }
        let file = GgufFile::from_bytes(writer.build().0).unwrap();
        let tokenizer = Tokenizer::from_gguf(&file).unwrap();
        assert_eq!(tokenizer.vocab_size(), shape.vocab, "{name}");
        let text = "Any text, even ünïcödé and\ttabs: 1234 — tokenizes.";
        let ids = tokenizer.encode(text, false, false);
        assert!(ids.len() < text.chars().count(), "{name}: merges apply: {} tokens", ids.len());
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text, "{name}");
    }
}
