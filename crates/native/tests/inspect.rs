//! `flint inspect` end to end: the built binary on both real models, and its errors.

use std::process::{Command, Output};

use flint_e2e::{GEMMA3, SMOLLM2};

fn flint(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flint")).args(args).output().unwrap()
}

fn stdout(output: &Output) -> &str {
    assert!(output.status.success(), "flint failed: {}", String::from_utf8_lossy(&output.stderr));
    std::str::from_utf8(&output.stdout).unwrap()
}

fn inspect_json(path: &std::path::Path) -> serde_json::Value {
    let output = flint(&["inspect", "--model", path.to_str().unwrap(), "--json"]);
    serde_json::from_str(stdout(&output)).unwrap()
}

#[test]
fn inspect_json_describes_smollm2() {
    let path = SMOLLM2.path();
    let json = inspect_json(&path);
    assert_eq!(json["architecture"], "llama");
    assert_eq!(json["name"], "Smollm2 135M 8k Lc100K Mix1 Ep2");
    assert_eq!(json["gguf_version"], 3);
    assert_eq!(json["file_bytes"], std::fs::metadata(&path).unwrap().len());
    let h = &json["hyper_parameters"];
    assert_eq!(
        (&h["context_length"], &h["embedding_length"], &h["block_count"]),
        (&8192.into(), &576.into(), &30.into())
    );
    assert_eq!(
        (&h["feed_forward_length"], &h["head_count"], &h["head_count_kv"]),
        (&1536.into(), &9.into(), &3.into())
    );
    assert_eq!(
        (&h["rope_dimension_count"], &h["key_length"], &h["sliding_window"]),
        (&64.into(), &serde_json::Value::Null, &serde_json::Value::Null)
    );
    assert_eq!(h["rope_freq_base"].as_f64(), Some(100_000.0));
    assert!((h["rms_norm_epsilon"].as_f64().unwrap() - 1e-5).abs() < 1e-12);
    let tokenizer = &json["tokenizer"];
    assert_eq!(
        (&tokenizer["model"], &tokenizer["kind"], &tokenizer["pre"]),
        (&"gpt2".into(), &"byte-level BPE".into(), &"smollm".into())
    );
    assert_eq!(
        (&tokenizer["vocab_size"], &tokenizer["bos_token_id"], &tokenizer["eos_token_id"]),
        (&49152.into(), &1.into(), &2.into())
    );
    assert_eq!(json["has_chat_template"], true);
    assert_eq!(json["tensor_count"], 272);
    let types = json["tensor_types"].as_array().unwrap();
    let counts: Vec<(&str, u64)> =
        types.iter().map(|t| (t["type"].as_str().unwrap(), t["count"].as_u64().unwrap())).collect();
    assert_eq!(counts, [("Q4_1", 210), ("F32", 61), ("Q8_0", 1)]);
    let type_bytes: u64 = types.iter().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(json["tensor_bytes"], type_bytes);
}

#[test]
fn inspect_json_describes_gemma3() {
    let json = inspect_json(&GEMMA3.path());
    assert_eq!(json["architecture"], "gemma3");
    let h = &json["hyper_parameters"];
    assert_eq!(
        (&h["block_count"], &h["head_count"], &h["head_count_kv"]),
        (&18.into(), &4.into(), &1.into())
    );
    assert_eq!(
        (&h["key_length"], &h["value_length"], &h["sliding_window"]),
        (&256.into(), &256.into(), &512.into())
    );
    assert_eq!(h["rope_dimension_count"], serde_json::Value::Null);
    assert_eq!(h["rope_freq_base"].as_f64(), Some(1_000_000.0));
    assert_eq!(
        (&json["tokenizer"]["kind"], &json["tokenizer"]["vocab_size"]),
        (&"SentencePiece".into(), &262144.into())
    );
    assert_eq!(json["has_chat_template"], false);
    assert_eq!(json["tensor_count"], 236);
    let types: Vec<&str> =
        json["tensor_types"].as_array().unwrap().iter().map(|t| t["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["F32", "Q5_0", "Q4_K", "Q8_0", "Q6_K"]);
}

#[test]
fn inspect_prints_a_readable_summary() {
    let output = flint(&["inspect", "--model", SMOLLM2.path().to_str().unwrap()]);
    let text = stdout(&output);
    for line in [
        "architecture          llama\n",
        "file                  GGUF v3, 98362432 bytes (93.8 MiB)\n",
        "block_count           30\n",
        "head_count_kv         3\n",
        "rms_norm_epsilon      1e-5\n",
        "rope_freq_base        100000\n",
        "tokenizer             gpt2 (byte-level BPE), pre-tokenizer smollm, 49152 tokens, bos 1, eos 2\n",
        "chat_template         yes\n",
    ] {
        assert!(text.contains(line), "{line:?} not in\n{text}");
    }
    assert!(
        text.contains("tensors               272, ") && text.contains(": 210 Q4_1, 61 F32, 1 Q8_0\n"),
        "{text}"
    );
}

/// Runs `flint` expecting it to fail with `status`, and returns its stderr.
fn failure(args: &[&str], status: i32) -> String {
    let output = flint(args);
    assert_eq!(output.status.code(), Some(status), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn errors_are_one_line_and_exit_1() {
    let missing = failure(&["inspect", "--model", "/nonexistent/model.gguf"], 1);
    assert_eq!(
        missing,
        "error: cannot read '/nonexistent/model.gguf': No such file or directory (os error 2)\n"
    );

    let not_gguf = failure(&["inspect", "--model", env!("CARGO_MANIFEST_PATH")], 1);
    assert!(not_gguf.starts_with("error: GGUF file header: not a GGUF file"), "{not_gguf}");
    assert_eq!(not_gguf.lines().count(), 1, "{not_gguf}");
}

#[test]
fn usage_errors_exit_2() {
    let no_model = failure(&["inspect", "--model"], 2);
    assert!(no_model.contains("--model <FILE>"), "{no_model}");
    failure(&["no-such-command"], 2);
}
