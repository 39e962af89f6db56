//! The GGUF reader on the two real models: header, metadata, hyper-parameters, and every
//! tensor's place in the file. Expected values were read from the files independently (a
//! 40-line Python parser of the GGUF spec) and agree with the model cards.

use std::collections::BTreeMap;

use flint_core::gguf::{GgufFile, MetadataValue};
use flint_e2e::{GEMMA3, ReferenceModel, SMOLLM2};

fn open(model: ReferenceModel) -> GgufFile {
    GgufFile::open(model.path()).unwrap()
}

fn count_by_type(file: &GgufFile) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for tensor in file.tensors() {
        *counts.entry(tensor.quant().name()).or_default() += 1;
    }
    counts
}

/// Every tensor lies inside the file, and the tensors tile the data section in file order:
/// each starts at the first aligned offset after the previous one, and the file ends with the
/// last. This checks the byte size computed for every tensor of every type.
fn assert_tensors_tile_the_data_section(file: &GgufFile) {
    assert_eq!(file.data_offset() % file.alignment(), 0);
    let mut next_offset = 0;
    for tensor in file.tensors() {
        assert_eq!(tensor.offset(), next_offset, "tensor '{}'", tensor.name());
        assert_eq!(tensor.file_offset(), file.data_offset() as u64 + tensor.offset());
        let end = tensor.file_offset() + tensor.bytes() as u64;
        assert!(end <= file.file_bytes(), "tensor '{}'", tensor.name());
        assert_eq!(file.tensor_bytes(tensor).unwrap().len(), tensor.bytes());
        assert_eq!(tensor.bytes(), tensor.rows() * tensor.row_bytes());
        next_offset = (tensor.offset() + tensor.bytes() as u64).next_multiple_of(file.alignment() as u64);
    }
    let last = file.tensors().last().unwrap();
    assert_eq!(last.file_offset() + last.bytes() as u64, file.file_bytes());
}

/// Each of the model's `block_count` layers has these tensors.
fn assert_every_layer_has(file: &GgufFile, block_count: u32, suffixes: &[&str]) {
    for layer in 0..block_count {
        for suffix in suffixes {
            let name = format!("blk.{layer}.{suffix}");
            assert!(file.tensor(&name).is_some(), "{name} is missing");
        }
    }
}

#[test]
fn reads_smollm2() {
    let file = open(SMOLLM2);
    let metadata = file.metadata();
    assert_eq!((file.version(), metadata.len(), file.tensors().len()), (3, 33, 272));
    assert_eq!(file.file_bytes(), 98_362_432);
    assert_eq!(file.alignment(), 32);
    assert_eq!(metadata.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(metadata.get_str("general.name").unwrap(), "Smollm2 135M 8k Lc100K Mix1 Ep2");
    let u32_of = |key| metadata.get_u32(key).unwrap();
    assert_eq!(u32_of("llama.block_count"), 30);
    assert_eq!(u32_of("llama.context_length"), 8192);
    assert_eq!(u32_of("llama.embedding_length"), 576);
    assert_eq!(u32_of("llama.feed_forward_length"), 1536);
    assert_eq!(u32_of("llama.attention.head_count"), 9);
    assert_eq!(u32_of("llama.attention.head_count_kv"), 3);
    assert_eq!(u32_of("llama.rope.dimension_count"), 64);
    assert_eq!(u32_of("llama.vocab_size"), 49152);
    assert_eq!(metadata.get_f32("llama.rope.freq_base").unwrap(), 100_000.0);
    assert_eq!(metadata.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(), 1e-5);
    assert_eq!(metadata.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(metadata.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    let tokens: &[String] = metadata.require("tokenizer.ggml.tokens").unwrap();
    assert_eq!((tokens.len(), tokens[1].as_str(), tokens[2].as_str()), (49152, "<|im_start|>", "<|im_end|>"));
    let merges: &[String] = metadata.require("tokenizer.ggml.merges").unwrap();
    assert_eq!((merges.len(), merges[0].as_str()), (48900, "Ġ t"));
    assert_eq!(metadata.require::<&[i32]>("tokenizer.ggml.token_type").unwrap().len(), 49152);
    assert_eq!(metadata.get("tokenizer.ggml.add_bos_token"), Some(&MetadataValue::Bool(false)));
    assert!(metadata.get_str("tokenizer.chat_template").unwrap().contains("<|im_start|>"));

    assert_eq!(count_by_type(&file), BTreeMap::from([("F32", 61), ("Q4_1", 210), ("Q8_0", 1)]));
    let embedding = file.tensor("token_embd.weight").unwrap();
    assert_eq!((embedding.quant().name(), embedding.shape()), ("Q8_0", &[576, 49152][..]));
    assert_eq!(file.tensor("blk.0.attn_q.weight").unwrap().shape(), [576, 576]);
    assert_eq!(file.tensor("blk.0.attn_k.weight").unwrap().shape(), [576, 192]);
    assert_eq!(file.tensor("blk.29.ffn_down.weight").unwrap().shape(), [1536, 576]);
    assert_every_layer_has(
        &file,
        30,
        &[
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "ffn_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
        ],
    );
    assert_tensors_tile_the_data_section(&file);
}

#[test]
fn reads_gemma3() {
    let file = open(GEMMA3);
    let metadata = file.metadata();
    assert_eq!((file.version(), metadata.len(), file.tensors().len()), (3, 33, 236));
    assert_eq!(file.file_bytes(), 253_113_024);
    assert_eq!(metadata.get_str("general.architecture").unwrap(), "gemma3");
    let u32_of = |key| metadata.get_u32(key).unwrap();
    assert_eq!(u32_of("gemma3.block_count"), 18);
    assert_eq!(u32_of("gemma3.context_length"), 32768);
    assert_eq!(u32_of("gemma3.embedding_length"), 640);
    assert_eq!(u32_of("gemma3.feed_forward_length"), 2048);
    assert_eq!(u32_of("gemma3.attention.head_count"), 4);
    assert_eq!(u32_of("gemma3.attention.head_count_kv"), 1);
    assert_eq!(u32_of("gemma3.attention.key_length"), 256);
    assert_eq!(u32_of("gemma3.attention.value_length"), 256);
    assert_eq!(u32_of("gemma3.attention.sliding_window"), 512);
    assert_eq!(metadata.get_f32("gemma3.rope.freq_base").unwrap(), 1_000_000.0);
    assert_eq!(metadata.get_f32("gemma3.attention.layer_norm_rms_epsilon").unwrap(), 1e-6);
    assert_eq!(metadata.get_str("tokenizer.ggml.model").unwrap(), "llama");
    let tokens: &[String] = metadata.require("tokenizer.ggml.tokens").unwrap();
    assert_eq!((tokens.len(), tokens[2].as_str()), (262144, "<bos>"));
    assert_eq!(metadata.require::<&[f32]>("tokenizer.ggml.scores").unwrap().len(), 262144);
    assert_eq!(metadata.get("tokenizer.ggml.add_bos_token"), Some(&MetadataValue::Bool(true)));
    assert_eq!(metadata.get("tokenizer.chat_template"), None);

    assert_eq!(
        count_by_type(&file),
        BTreeMap::from([("F32", 109), ("Q4_K", 27), ("Q5_0", 81), ("Q6_K", 9), ("Q8_0", 10)])
    );
    let embedding = file.tensor("token_embd.weight").unwrap();
    assert_eq!((embedding.quant().name(), embedding.shape()), ("Q8_0", &[640, 262144][..]));
    assert!(embedding.bytes() > 128 << 20, "larger than one lavapipe binding: {}", embedding.bytes());
    assert_eq!(file.tensor("blk.0.attn_q.weight").unwrap().shape(), [640, 1024]);
    assert_eq!(file.tensor("blk.0.attn_k.weight").unwrap().shape(), [640, 256]);
    assert_every_layer_has(
        &file,
        18,
        &[
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "attn_output.weight",
            "post_attention_norm.weight",
            "ffn_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
            "post_ffw_norm.weight",
        ],
    );
    assert_tensors_tile_the_data_section(&file);
}

#[test]
fn a_byte_buffer_reads_like_the_mapped_file() {
    for model in [SMOLLM2, GEMMA3] {
        let mapped = open(model);
        let buffered = GgufFile::from_bytes(std::fs::read(model.path()).unwrap()).unwrap();
        assert_eq!(mapped.metadata().entries(), buffered.metadata().entries());
        assert_eq!(mapped.tensors(), buffered.tensors());
        for tensor in mapped.tensors().iter().step_by(17) {
            assert!(
                mapped.tensor_bytes(tensor).unwrap() == buffered.tensor_bytes(tensor).unwrap(),
                "{}",
                tensor.name()
            );
        }
    }
}

#[test]
fn summarizes_both_models() {
    let smollm2 = open(SMOLLM2).summary().unwrap();
    assert_eq!((smollm2.architecture.as_str(), smollm2.tensor_count), ("llama", 272));
    assert_eq!(smollm2.hyper_parameters.head_count_kv, Some(3));
    let tokenizer = smollm2.tokenizer.as_ref().unwrap();
    assert_eq!(
        (tokenizer.kind, tokenizer.vocab_size, tokenizer.pre.as_deref()),
        ("byte-level BPE", Some(49152), Some("smollm"))
    );
    assert!(smollm2.has_chat_template);
    assert!(smollm2.tensor_bytes < smollm2.file_bytes);

    let gemma3 = open(GEMMA3).summary().unwrap();
    assert_eq!((gemma3.architecture.as_str(), gemma3.tensor_count), ("gemma3", 236));
    assert_eq!(
        (gemma3.hyper_parameters.key_length, gemma3.hyper_parameters.sliding_window),
        (Some(256), Some(512))
    );
    assert_eq!(gemma3.hyper_parameters.rope_dimension_count, None);
    let tokenizer = gemma3.tokenizer.as_ref().unwrap();
    assert_eq!(
        (tokenizer.kind, tokenizer.vocab_size, tokenizer.bos_token_id),
        ("SentencePiece", Some(262144), Some(2))
    );
    assert!(!gemma3.has_chat_template);
    assert_eq!(gemma3.tensor_types.iter().map(|t| t.count).sum::<usize>(), 236);
}
