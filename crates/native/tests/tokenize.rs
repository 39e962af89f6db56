//! `flint tokenize` end to end: the built binary against llama.cpp's `tokenize.json` for both
//! real models, from `--text` and from standard input, and its errors.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use flint_e2e::MODELS;

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids_plain: Vec<u32>,
    ids_with_special: Vec<u32>,
}

fn flint(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or_default()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn ids(output: &Output) -> Vec<u32> {
    assert!(output.status.success(), "flint failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn tokenize_matches_llama_cpp_from_text_and_stdin() {
    for model in MODELS {
        let path = model.path();
        let path = path.to_str().unwrap();
        let reference = model.reference_dir().join("tokenize.json");
        let cases: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
        for case in &cases {
            let what = format!("{} {:?}", model.reference_name, case.text);
            let plain = flint(&["tokenize", "--model", path, "--text", &case.text], None);
            assert_eq!(ids(&plain), case.ids_plain, "{what} (--text)");
            let special = flint(&["tokenize", "--model", path, "--add-special"], Some(case.text.as_bytes()));
            assert_eq!(ids(&special), case.ids_with_special, "{what} (stdin, --add-special)");
        }
    }
}

#[test]
fn invalid_utf8_and_missing_files_are_one_line_errors() {
    let path = MODELS[0].path();
    let output = flint(&["tokenize", "--model", path.to_str().unwrap()], Some(b"ok \xff\xfe"));
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("not valid UTF-8") && stderr.contains("offset 3"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");

    let output = flint(&["tokenize", "--model", "/nonexistent.gguf", "--text", "x"], None);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent.gguf"));
}
