//! `/metrics`: the engine's metrics in Prometheus' text exposition format.

use std::fmt::Write;

use crate::EngineMetrics;

/// The metrics as Prometheus text: one `# HELP`, one `# TYPE` and the samples per metric.
pub fn exposition(m: &EngineMetrics) -> String {
    let mut text = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
        // Writing to a String cannot fail.
        let _ = writeln!(text, "# HELP flint_{name} {help}\n# TYPE flint_{name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(text, "flint_{name}{labels} {value}");
        }
    };
    metric(
        "running_sequences",
        "gauge",
        "Sequences in the running batch.",
        &[("", m.running_sequences as f64)],
    );
    metric(
        "waiting_sequences",
        "gauge",
        "Sequences waiting for admission.",
        &[("", m.waiting_sequences as f64)],
    );
    metric(
        "kv_blocks",
        "gauge",
        "Blocks of the paged KV cache: used by running sequences, holding a cached prefix, or free.",
        &[
            ("{state=\"used\"}", m.kv_blocks_used as f64),
            ("{state=\"cached\"}", m.kv_blocks_cached as f64),
            ("{state=\"free\"}", (m.kv_blocks_free - m.kv_blocks_cached.min(m.kv_blocks_free)) as f64),
        ],
    );
    metric(
        "kv_blocks_total",
        "gauge",
        "Blocks of the KV cache, all together.",
        &[("", m.kv_blocks_total as f64)],
    );
    metric("kv_block_tokens", "gauge", "Tokens per KV block.", &[("", m.kv_block_tokens as f64)]);
    metric(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens of every admitted sequence.",
        &[("", m.prompt_tokens as f64)],
    );
    metric(
        "cached_prompt_tokens_total",
        "counter",
        "Prompt tokens whose keys and values came from the prefix cache.",
        &[("", m.cached_prompt_tokens as f64)],
    );
    metric(
        "prefix_cache_hit_rate",
        "gauge",
        "Cached prompt tokens over prompt tokens.",
        &[("", m.prefix_cache_hit_rate)],
    );
    metric("generated_tokens_total", "counter", "Tokens generated.", &[("", m.generated_tokens as f64)]);
    metric(
        "generation_tokens_per_second",
        "gauge",
        "Tokens generated per second over the last steps.",
        &[("", m.generation_tokens_per_second)],
    );
    metric("steps_total", "counter", "Forward passes run.", &[("", m.steps as f64)]);
    metric(
        "overlapped_steps_total",
        "counter",
        "Forward passes submitted before the one before them was read back.",
        &[("", m.overlapped_steps as f64)],
    );
    metric(
        "preemptions_total",
        "counter",
        "Sequences preempted (and later recomputed) because the KV cache was full.",
        &[("", m.preemptions as f64)],
    );
    metric(
        "healthy",
        "gauge",
        "1 while the engine serves; 0 once its GPU failed (the server then needs a restart).",
        &[("", f64::from(u8::from(m.healthy)))],
    );
    text
}
