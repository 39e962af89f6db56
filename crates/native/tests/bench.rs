//! `flint bench` end to end: it runs a small workload and reports consistent figures. Speed
//! itself is never asserted (the machine decides it); BENCHMARKS.md records it.

use std::process::Command;

use flint_e2e::SMOLLM2;

#[test]
fn bench_reports_consistent_figures() {
    let path = SMOLLM2.path();
    let args =
        ["--prompt-tokens", "20", "--gen-tokens", "4", "--concurrency", "2", "--repeats", "1", "--json"];
    let output = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["bench", "--model", path.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let number = |key: &str| report[key].as_f64().unwrap_or_else(|| panic!("{key} missing: {report}"));
    for key in ["prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_s", "roofline_fraction"] {
        assert!(number(key).is_finite() && number(key) > 0.0, "{key}: {report}");
    }
    assert_eq!((number("prompt_tokens"), number("gen_tokens"), number("concurrency")), (20.0, 4.0, 2.0));
    // SmolLM2's output is its token embedding: a decode step reads every weight.
    assert_eq!(number("weight_bytes_per_decode_step"), number("weight_bytes"));
    // Every layer records several kernels per decode step.
    let per_step = number("dispatches_per_decode_step");
    assert!(per_step >= 30.0 * 5.0, "{report}");
    // SmolLM2's layers record 5 each (q/k/v, attention, output, gate/up, down); the embedding, and
    // the output norm and head, are outside them.
    assert_eq!(number("dispatches_per_layer"), 5.0, "{report}");
    assert_eq!(number("layers"), 30.0, "{report}");
    // After the warm-up run and two decode steps, a decode step reuses every buffer, pipeline and
    // bind group: the model keeps its passes' bind groups, and the pool hands out the same buffers.
    let created = &report["created_per_decode_step"];
    assert_eq!(
        (created["buffers"].as_f64(), created["bind_groups"].as_f64(), created["pipelines"].as_f64()),
        (Some(0.0), Some(0.0), Some(0.0)),
        "{report}"
    );
    let host_ms = number("host_ms_per_decode_step");
    assert!(host_ms > 0.0 && host_ms.is_finite(), "{report}");
    assert!(
        (number("dispatches_per_layer") * 30.0 + number("dispatches_outside_layers") - per_step).abs() < 1e-9
    );
    let file_bytes = std::fs::metadata(&path).unwrap().len() as f64;
    assert!(number("weight_bytes") > 0.9 * file_bytes && number("weight_bytes") < file_bytes);
    // 2 sequences of 24 tokens, rounded up to blocks of 16: 64 tokens × 30 layers × K and V × 3 heads × 64 × 2
    // bytes (f16).
    assert_eq!(number("kv_cache_bytes"), (64 * 30 * 2 * 3 * 64 * 2) as f64);
    // The peak holds the weights (as on the GPU: about their size in the file), the KV cache and
    // a step's activations, which for 40 prompt tokens are a few MiB.
    let held = number("weight_bytes") + number("kv_cache_bytes");
    let peak = number("peak_gpu_bytes");
    assert!(peak > 0.95 * held && peak < held + (32 << 20) as f64, "{report}");

    // With timestamps (lavapipe has them), the profile's kernel times and the GPU's idle share.
    let profiled = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["bench", "--model", path.to_str().unwrap()])
        .args(["--prompt-tokens", "8", "--gen-tokens", "3", "--repeats", "1", "--profile", "--json"])
        .output()
        .unwrap();
    assert!(profiled.status.success(), "{}", String::from_utf8_lossy(&profiled.stderr));
    let profiled: serde_json::Value = serde_json::from_slice(&profiled.stdout).unwrap();
    let profile = &profiled["profile"];
    let idle = profile["decode_step_gpu_idle_fraction"].as_f64().unwrap_or(-1.0);
    let kernels = profile["decode_step"].as_array().map_or(0, Vec::len);
    assert!((0.0..=1.0).contains(&idle) && kernels >= 3, "{profiled}");

    // A budget smaller than the weights: the load fails with a one-line error.
    let small = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["bench", "--model", path.to_str().unwrap(), "--gpu-memory-budget", "16"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&small.stderr);
    assert_eq!(small.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("out of GPU memory") && stderr.contains("the budget is 16777216"), "{stderr}");

    let bad = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["bench", "--model", path.to_str().unwrap(), "--prompt-tokens", "9000"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("context"));
}
