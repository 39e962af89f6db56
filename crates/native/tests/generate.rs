//! `flint generate` and `flint perplexity` end to end: the built binary on the real models, and
//! the errors a user meets (a prompt longer than the context, an id outside the vocabulary, an
//! unsupported architecture), each one line on stderr and a non-zero exit, never a panic.

use std::process::{Command, Output};

use flint_e2e::{SMOLLM2, model_dir};

fn flint(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flint")).args(args).output().unwrap()
}

fn assert_one_line_error(output: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|line| line.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line expected, stderr: {stderr}");
    assert!(errors[0].contains(needle), "{:?} should mention {needle:?}", errors[0]);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn greedy_generation_starts_like_llama_cpp() {
    let path = SMOLLM2.path();
    let model = path.to_str().unwrap();
    let prompt = ["--prompt", "The capital of France is", "--temperature", "0", "--max-tokens", "3"];
    let streamed = flint(&[&["generate", "--model", model][..], &prompt].concat());
    assert!(streamed.status.success(), "{}", String::from_utf8_lossy(&streamed.stderr));
    let text = String::from_utf8(streamed.stdout).unwrap();
    assert!(text.starts_with(" Paris."), "{text:?}");

    let json = flint(&[&["generate", "--model", model, "--json"][..], &prompt].concat());
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    // llama.cpp's first greedy tokens for this prompt (greedy.json).
    assert_eq!(json["output_ids"], serde_json::json!([7042, 30, 198]));
    assert_eq!(json["text"].as_str().map(str::trim_end), text.strip_suffix('\n').map(str::trim_end));
    let meta = &json["meta_info"];
    assert_eq!((&meta["prompt_tokens"], &meta["completion_tokens"]), (&5.into(), &3.into()));
    assert_eq!(meta["finish_reason"]["type"], "length");
}

#[test]
fn bad_prompts_are_one_line_errors() {
    let path = SMOLLM2.path();
    let model = path.to_str().unwrap();
    let too_long = serde_json::to_string(&vec![504u32; 8193]).unwrap();
    assert_one_line_error(&flint(&["generate", "--model", model, "--input-ids", &too_long]), "context");
    assert_one_line_error(
        &flint(&["generate", "--model", model, "--input-ids", "[504, 49152]"]),
        "token id 49152 is outside the vocabulary",
    );
    assert_one_line_error(
        &flint(&["generate", "--model", model, "--prompt", "x", "--max-tokens", "9000"]),
        "max_new_tokens",
    );
    assert_one_line_error(&flint(&["generate", "--model", model, "--prompt", "x", "--top-p", "0"]), "top_p");
}

#[test]
fn an_unsupported_architecture_is_named() {
    let tiny = model_dir().join("tiny").join("tiny-qwen2-f16.gguf");
    let mut bytes = std::fs::read(&tiny)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/fixtures/make_tiny_models.sh", tiny.display()));
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("the architecture key");
    // key, then the value's type (u32) and length (u64), then the string itself.
    let value = at + key.len() + 4 + 8;
    assert_eq!(&bytes[value..value + 5], b"qwen2");
    bytes[value..value + 5].copy_from_slice(b"qwen9");
    let path = std::env::temp_dir().join(format!("flint-unsupported-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let output = flint(&["generate", "--model", path.to_str().unwrap(), "--input-ids", "[1, 2]"]);
    std::fs::remove_file(&path).unwrap();
    assert_one_line_error(&output, "qwen9");
}

#[test]
fn perplexity_prints_json_and_rejects_a_window_beyond_the_context() {
    let path = SMOLLM2.path();
    let model = path.to_str().unwrap();
    let text = "/usr/share/common-licenses/Apache-2.0";
    let output =
        flint(&["perplexity", "--model", model, "--file", text, "--ctx", "32", "--windows", "2", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!((&json["scored_tokens"], &json["windows"], &json["ctx"]), (&62.into(), &2.into(), &32.into()));
    let ppl = json["ppl"].as_f64().unwrap();
    // A 135M model on licence text: far better than uniform over 49152 tokens, far from perfect.
    assert!((5.0..200.0).contains(&ppl), "{ppl}");
    assert_one_line_error(&flint(&["perplexity", "--model", model, "--file", text, "--ctx", "9000"]), "ctx");
}
