//! `flint run` and `flint chat` end to end: the built binary on SmolLM2, the default model from
//! the cache directory, a conversation piped to standard input whose second turn reuses the
//! first one's KV blocks, and the exit codes of errors and usage errors.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use flint_e2e::{SMOLLM2, model_dir};

/// `flint` with the model cache pointing at the test models' folder, and `stdin` piped in.
fn flint(args: &[&str], stdin: &str) -> Output {
    flint_bytes(args, stdin.as_bytes())
}

fn flint_bytes(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(args)
        .env("FLINT_MODEL_DIR", model_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

#[test]
fn run_answers_through_the_chat_template_with_the_default_model() {
    SMOLLM2.path();
    let greedy = ["--temperature", "0", "--max-tokens", "8"];
    let output = flint(&[&["run", "What is the capital of France?"][..], &greedy].concat(), "");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("Paris"), "{:?}", text(&output.stdout));
    // The prompt from standard input gives the same answer; --quiet leaves stderr empty.
    let piped = flint(&[&["run", "--quiet"][..], &greedy].concat(), "What is the capital of France?\n");
    assert!(piped.status.success(), "{}", text(&piped.stderr));
    assert_eq!(text(&piped.stdout), text(&output.stdout));
    assert_eq!(text(&piped.stderr), "");
}

#[test]
fn chat_keeps_the_conversation_and_reuses_its_kv_blocks() {
    let model = SMOLLM2.path();
    let conversation =
        "What is the capital of France?\nAnd of Germany?\n/reset\n/nonsense\nHi\n/exit\nnot read\n";
    let args = ["chat", "--model", model.to_str().unwrap(), "--temperature", "0", "--max-tokens", "8"];
    let output = flint(&args, conversation);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let answers: Vec<&str> = text(&output.stdout).lines().collect();
    assert_eq!(answers.len(), 3, "three turns before /exit: {answers:?}");
    assert!(answers[0].contains("Paris"), "{answers:?}");
    // The second answer only makes sense with the first turn in the prompt.
    assert!(answers[1].contains("Berlin"), "{answers:?}");
    // One statistics line per turn: the second turn's prompt starts with the first turn's.
    let cached: Vec<usize> = stderr
        .lines()
        .filter_map(|line| line.strip_suffix(" from the prefix cache]"))
        .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(cached.len(), 3, "{stderr}");
    assert_eq!(cached[0], 0, "{stderr}");
    assert!(cached[1] >= 32, "the first turn's blocks are reused: {stderr}");
    assert!(
        stderr.contains("(new conversation)") && stderr.contains("unknown command /nonsense"),
        "{stderr}"
    );
}

#[test]
fn invalid_utf8_on_standard_input_is_a_one_line_error() {
    let run = flint_bytes(&["run", "--quiet"], b"hello \xc3\x28 world");
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("not valid UTF-8 (first bad byte at offset 6)"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");

    let chat = flint_bytes(&["chat", "--quiet", "--max-tokens", "2"], b"Hi!\n\xff\xfe\n");
    assert_eq!(chat.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&chat.stderr);
    assert!(stderr.contains("line 2 of standard input is not valid UTF-8"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn errors_exit_1_and_usage_errors_exit_2() {
    let missing = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["run", "hi"])
        .env("FLINT_MODEL_DIR", "/nonexistent/flint-models")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let stderr = text(&missing.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("scripts/fetch-models.sh"), "{stderr}");

    let bad_value = flint(&["run", "hi", "--top-p", "0", "--quiet"], "");
    assert_eq!(bad_value.status.code(), Some(1));
    assert!(text(&bad_value.stderr).starts_with("error: invalid value for 'top_p'"), "{:?}", bad_value);

    for usage in
        [&["run", "--temperature"][..], &["chat", "--max-tokens", "many"], &["serve", "--port", "99999"]]
    {
        let output = flint(usage, "");
        assert_eq!(output.status.code(), Some(2), "{usage:?}: {}", text(&output.stderr));
    }
}

#[test]
fn a_chat_template_file_that_cannot_be_read_or_compiled_is_an_error_naming_it() {
    SMOLLM2.path();
    let missing = format!("/nonexistent/flint-{}.jinja", std::process::id());
    let output = flint(&["run", "hi", "--quiet", "--chat-template-file", &missing], "");
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.starts_with(&format!("error: cannot read the chat template file {missing}")), "{stderr}");

    let bad = std::env::temp_dir().join(format!("flint-bad-template-{}.jinja", std::process::id()));
    std::fs::write(&bad, "{% for m in messages %}{{ m.content }}").unwrap();
    let bad_path = bad.to_str().unwrap();
    let output = flint(&["chat", "--quiet", "--chat-template-file", bad_path], "hi\n");
    std::fs::remove_file(&bad).unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: --chat-template-file {bad_path}: "))
            && stderr.contains("does not compile"),
        "{stderr}"
    );
}
