//! `flint synth` end to end: the built binary writes a synthetic model that `flint inspect`
//! reads as the named model's shapes, the same seed writes the same file, and unknown names
//! are errors that list the known ones.

use std::process::{Command, Output};

fn flint(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flint")).args(args).output().unwrap()
}

fn succeeded(output: &Output) -> &str {
    assert!(output.status.success(), "flint failed: {}", String::from_utf8_lossy(&output.stderr));
    std::str::from_utf8(&output.stdout).unwrap()
}

#[test]
fn synth_writes_a_model_inspect_reads_as_the_named_shape() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (first, second) = (dir.join("synth-a.gguf"), dir.join("synth-b.gguf"));
    for path in [&first, &second] {
        let args = ["-q", "synth", "--model", "qwen3-0.6b", "--quant", "q8_0", "--seed", "9", "-o"];
        succeeded(&flint(&[&args[..], &[path.to_str().unwrap()]].concat()));
    }
    let (a, b) = (std::fs::read(&first).unwrap(), std::fs::read(&second).unwrap());
    assert!(a == b, "the same seed writes the same bytes");
    let json: serde_json::Value =
        serde_json::from_str(succeeded(&flint(&["inspect", "--model", first.to_str().unwrap(), "--json"])))
            .unwrap();
    assert_eq!(json["architecture"], "qwen3");
    let h = &json["hyper_parameters"];
    assert_eq!(
        (&h["embedding_length"], &h["block_count"], &h["key_length"]),
        (&1024.into(), &28.into(), &128.into())
    );
    for path in [first, second] {
        std::fs::remove_file(path).unwrap();
    }

    let listed = flint(&["synth", "--list"]);
    assert!(succeeded(&listed).contains("llama-3.1-8b"));
    let unknown = flint(&["synth", "--model", "gpt-5"]);
    assert!(!unknown.status.success());
    let message = String::from_utf8_lossy(&unknown.stderr);
    assert!(message.contains("no synthetic model 'gpt-5'") && message.contains("gemma-3-1b"), "{message}");
}
