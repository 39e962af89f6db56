//! `flint bench`: prefill and decode speed of a model on this machine's GPU, beside the memory
//! roofline that the device's own probe kernels measure.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use flint_core::generate::{decode_step, prefill};
use flint_core::gguf::GgufFile;
use flint_core::kernels::copy::measure_bandwidth;
use flint_core::model::Model;
use flint_core::sample::argmax;
use flint_core::tokenizer::Tokenizer;
use serde::Serialize;

use super::engine_bench;
use super::generate::read_json_schema;
use super::model::ModelArg;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 256, value_name = "N")]
    prompt_tokens: usize,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 128, value_name = "N")]
    gen_tokens: usize,
    /// Sequences decoded together in one batch.
    #[arg(long, default_value_t = 1, value_name = "N")]
    concurrency: usize,
    /// Timed runs after the warm-up; the median is reported.
    #[arg(long, default_value_t = 3, value_name = "N")]
    repeats: usize,
    /// Measure the engine instead (continuous batching, sampling and streaming, as a server
    /// runs it): aggregate decode tokens/s at each of these numbers of concurrent streams,
    /// e.g. `--streams 1,4,16`.
    #[arg(long, value_name = "N,N,..", value_delimiter = ',', conflicts_with = "concurrency")]
    streams: Vec<usize>,
    /// With `--streams`: measure each number of streams twice, without a constraint and with
    /// the output held to the JSON Schema in this file (same prompts, greedy), to see what
    /// structured output costs.
    #[arg(long, value_name = "FILE", requires = "streams")]
    json_schema: Option<PathBuf>,
    /// With `--streams`: whether the engine overlaps decode steps (submits each before reading
    /// the last one's draws back); by default as the device does (on for GPUs, off for CPU
    /// devices).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off, requires = "streams")]
    overlap: Option<bool>,
    /// Also time every kernel with GPU timestamps over a few extra decode steps (and the
    /// prefill before them), and print the time per kernel family.
    #[arg(long, conflicts_with = "streams")]
    profile: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn command(args: &BenchArgs, quiet: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let (file, tokenizer, model) = args.model.load_model(quiet)?;
    let load_s = started.elapsed().as_secs_f64();
    if !args.streams.is_empty() {
        return engine_command(args, tokenizer, model);
    }
    let options = BenchOptions {
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        concurrency: args.concurrency,
        repeats: args.repeats,
    };
    let r = run(&file, &tokenizer, &model, load_s, &options)?;
    let profile = if args.profile { Some(profile(&model, &tokenizer, &options)?) } else { None };
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut report = serde_json::to_value(&r)?;
        report["profile"] = serde_json::to_value(&profile)?;
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    writeln!(out, "adapter:        {}", r.adapter)?;
    writeln!(
        out,
        "workload:       {} prompt + {} generated tokens x {} sequences, median of {} runs",
        r.prompt_tokens, r.gen_tokens, r.concurrency, args.repeats
    )?;
    writeln!(out, "load:           {:.2} s", r.load_s)?;
    writeln!(out, "prefill:        {:.1} tokens/s", r.prefill_tokens_per_s)?;
    writeln!(out, "first token:    {:.3} s", r.time_to_first_token_s)?;
    writeln!(out, "decode:         {:.2} tokens/s", r.decode_tokens_per_s)?;
    writeln!(
        out,
        "memory:         weights {:.1} MiB, KV cache {:.1} MiB, peak with activations {:.1} MiB",
        r.weight_bytes as f64 / 1048576.0,
        r.kv_cache_bytes as f64 / 1048576.0,
        r.peak_gpu_bytes as f64 / 1048576.0
    )?;
    writeln!(
        out,
        "roofline:       {:.1} MB of weights per decode step, {:.2} GB/s device probe: {:.1}% of it \
         ({:.1}% of the buffer probes' {:.2} GB/s)",
        r.weight_bytes_per_decode_step as f64 / 1e6,
        r.roofline_bytes_per_s / 1e9,
        r.roofline_fraction * 100.0,
        r.buffer_probe_fraction * 100.0,
        r.buffer_probe_bytes_per_s / 1e9
    )?;
    writeln!(
        out,
        "dispatches:     {:.0} per decode step: {:.1} in each of the {} layers, {:.0} outside them",
        r.dispatches_per_decode_step, r.dispatches_per_layer, r.layers, r.dispatches_outside_layers
    )?;
    let created = &r.created_per_decode_step;
    writeln!(
        out,
        "created:        {:.1} buffers, {:.1} bind groups, {:.1} pipelines per decode step",
        created.buffers, created.bind_groups, created.pipelines
    )?;
    writeln!(
        out,
        "host:           {:.2} ms recording and submitting a decode step",
        r.host_ms_per_decode_step
    )?;
    if let Some(profile) = profile {
        for (phase, families) in [("prefill", &profile.prefill), ("decode step", &profile.decode_step)] {
            let total: f64 = families.iter().map(|f| f.ms).sum();
            let wall = match phase {
                "prefill" => format!("wall {:.2} ms", profile.prefill_wall_ms),
                _ => format!(
                    "wall {:.2} ms, of which {:.2} ms recording and submitting on the host; GPU idle {:.0}% \
                     of it",
                    profile.decode_step_wall_ms,
                    profile.decode_step_recording_ms,
                    profile.decode_step_gpu_idle_fraction * 100.0
                ),
            };
            writeln!(out, "\nGPU time per {phase}: {total:.2} ms (timestamps; {wall})")?;
            writeln!(out, "{:<24} {:>10} {:>10} {:>7}", "kernel", "dispatches", "ms", "share")?;
            for f in families.iter() {
                writeln!(
                    out,
                    "{:<24} {:>10.1} {:>10.3} {:>6.1}%",
                    f.kernel,
                    f.dispatches,
                    f.ms,
                    100.0 * f.ms / total.max(1e-12)
                )?;
            }
        }
    }
    Ok(())
}

/// GPU time per kernel family, from timestamps.
#[derive(Serialize)]
pub struct Profile {
    /// Prompt tokens per sequence that the prefill profile covers.
    pub prompt_tokens: usize,
    /// Every kernel of the prefill of one sequence, most expensive first.
    pub prefill: Vec<FamilyTime>,
    /// Wall-clock milliseconds of that prefill (recording, GPU, readback).
    pub prefill_wall_ms: f64,
    /// Every kernel of a decode step of the whole batch (mean of several steps).
    pub decode_step: Vec<FamilyTime>,
    /// Wall-clock milliseconds of a decode step (mean), from its recording to its logits on the
    /// host.
    pub decode_step_wall_ms: f64,
    /// Of those, the milliseconds spent recording and submitting the step's commands.
    pub decode_step_recording_ms: f64,
    /// The share of a decode step's wall time in which no kernel ran: 1 - GPU time / wall time.
    /// The profile times each dispatch in a pass of its own, which adds gaps a step without it
    /// does not have, so this bounds the idle share from above.
    pub decode_step_gpu_idle_fraction: f64,
}

/// One kernel family's share of a phase.
#[derive(Serialize)]
pub struct FamilyTime {
    /// The kernel's entry point.
    pub kernel: &'static str,
    /// Dispatches per phase.
    pub dispatches: f64,
    /// GPU milliseconds per phase.
    pub ms: f64,
}

/// Decode steps of each run that warm up before creations and host time are counted.
const WARM_DECODE_STEPS: usize = 2;

/// Decode steps the profile averages over.
const PROFILED_STEPS: usize = 4;

/// The most dispatches one profile can time: a query set holds 4096 timestamps, two each.
const PROFILE_MAX_DISPATCHES: u32 = 2048;

/// Times every kernel of one prefill and of a few decode steps of `options`' batch.
fn profile(model: &Model, tokenizer: &Tokenizer, options: &BenchOptions) -> anyhow::Result<Profile> {
    let ctx = model.gpu();
    let prompt = prompt_ids(tokenizer, options.prompt_tokens);
    let mut cache = model.new_kv_cache(Some(
        (prompt.len() + PROFILED_STEPS + 1).next_multiple_of(flint_core::model::KV_BLOCK_TOKENS)
            * options.concurrency,
    ))?;
    let mut tables: Vec<_> = (0..options.concurrency).map(|_| cache.new_sequence()).collect();
    let mut next = Vec::with_capacity(options.concurrency);
    let mut prefill_times = Vec::new();
    let mut prefill_wall_ms = 0.0;
    for (i, table) in tables.iter_mut().enumerate() {
        cache.append(table, prompt.len())?;
        let started = Instant::now();
        if i == 0 {
            ctx.start_profile(PROFILE_MAX_DISPATCHES)?;
        }
        let row = pollster::block_on(prefill(model, &cache, table, &prompt)?.to_f32(ctx))?;
        if i == 0 {
            prefill_wall_ms = started.elapsed().as_secs_f64() * 1e3;
            prefill_times = pollster::block_on(ctx.finish_profile())?;
        }
        next.push(argmax(&row).unwrap_or(0));
    }
    let vocab = model.config().vocab_size;
    let mut decode_times = Vec::new();
    let (mut wall_s, mut recording_s) = (0.0, 0.0);
    for _ in 0..PROFILED_STEPS {
        ctx.start_profile(PROFILE_MAX_DISPATCHES)?;
        let started = Instant::now();
        let logits = decode_step(model, &mut cache, &mut tables, &next)?;
        recording_s += started.elapsed().as_secs_f64();
        let logits = pollster::block_on(logits.to_f32(ctx))?;
        wall_s += started.elapsed().as_secs_f64();
        decode_times.extend(pollster::block_on(ctx.finish_profile())?);
        next = logits.chunks_exact(vocab).map(|row| argmax(row).unwrap_or(0)).collect();
    }
    let decode_step_wall_ms = wall_s * 1e3 / PROFILED_STEPS as f64;
    let decode_step_recording_ms = recording_s * 1e3 / PROFILED_STEPS as f64;
    for table in tables {
        cache.release(table);
    }
    let decode_step = by_family(&decode_times, PROFILED_STEPS);
    let decode_step_gpu_ms: f64 = decode_step.iter().map(|f| f.ms).sum();
    Ok(Profile {
        prompt_tokens: prompt.len(),
        prefill: by_family(&prefill_times, 1),
        prefill_wall_ms,
        decode_step,
        decode_step_wall_ms,
        decode_step_recording_ms,
        decode_step_gpu_idle_fraction: (1.0 - decode_step_gpu_ms / decode_step_wall_ms).clamp(0.0, 1.0),
    })
}

/// Kernel times summed per entry point and divided by `phases`, most expensive first.
fn by_family(times: &[flint_core::gpu::KernelTime], phases: usize) -> Vec<FamilyTime> {
    let mut families: Vec<FamilyTime> = Vec::new();
    for time in times {
        let index = match families.iter().position(|f| f.kernel == time.kernel) {
            Some(index) => index,
            None => {
                families.push(FamilyTime { kernel: time.kernel, dispatches: 0.0, ms: 0.0 });
                families.len() - 1
            }
        };
        families[index].dispatches += 1.0 / phases as f64;
        families[index].ms += time.seconds * 1e3 / phases as f64;
    }
    families.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    families
}

/// `on` or `off`.
fn parse_on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected on or off, not {other:?}")),
    }
}

/// `--streams`: the engine's aggregate decode speed at each number of concurrent streams.
fn engine_command(args: &BenchArgs, tokenizer: Tokenizer, model: Model) -> anyhow::Result<()> {
    let schema = args.json_schema.as_deref().map(read_json_schema).transpose()?;
    let adapter = model.gpu().adapter_info().name.clone();
    let prompt = prompt_ids(&tokenizer, args.prompt_tokens);
    let most = args.streams.iter().copied().max().unwrap_or(1);
    let (engine, step_loop) =
        engine_bench::start(model, tokenizer, most, args.prompt_tokens + args.gen_tokens, args.overlap)?;
    let measure = |schema: Option<&serde_json::Value>| {
        engine_bench::run(&engine, &prompt, args.gen_tokens, &args.streams, args.repeats, schema)
    };
    let reports = measure(None);
    let constrained = match (&reports, &schema) {
        (Ok(_), Some(schema)) => Some(measure(Some(schema))),
        _ => None,
    };
    drop(engine);
    step_loop.join().map_err(|_| anyhow::anyhow!("the engine's step loop panicked"))?;
    let reports = reports?;
    let constrained = constrained.transpose()?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = serde_json::json!({
            "adapter": adapter,
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "repeats": args.repeats,
            "streams": reports,
            "json_schema_streams": constrained,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    writeln!(out, "adapter:  {adapter}")?;
    writeln!(
        out,
        "workload: {} prompt + {} generated tokens per stream, greedy, median of {} runs",
        args.prompt_tokens, args.gen_tokens, args.repeats
    )?;
    write!(out, "{:>8} {:>16} {:>12} {:>16}", "streams", "decode tok/s", "vs 1 stream", "first token s")?;
    if constrained.is_some() {
        write!(out, " {:>20} {:>10}", "json_schema tok/s", "vs free")?;
    }
    writeln!(out)?;
    for (i, r) in reports.iter().enumerate() {
        let ratio = r.ratio_to_one_stream.map_or("-".to_string(), |x| format!("{x:.2}x"));
        write!(
            out,
            "{:>8} {:>16.2} {:>12} {:>16.3}",
            r.streams, r.decode_tokens_per_s, ratio, r.time_to_first_token_s
        )?;
        if let Some(c) = constrained.as_ref().and_then(|c| c.get(i)) {
            let versus = c.decode_tokens_per_s / r.decode_tokens_per_s;
            write!(out, " {:>20.2} {:>10}", c.decode_tokens_per_s, format!("{versus:.2}x"))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// What to measure.
pub struct BenchOptions {
    /// Prompt tokens per sequence.
    pub prompt_tokens: usize,
    /// Generated tokens per sequence (the first comes from the prefill).
    pub gen_tokens: usize,
    /// Sequences decoded together as one batch.
    pub concurrency: usize,
    /// Timed runs (after one warm-up run); the median is reported.
    pub repeats: usize,
}

/// The figures `flint bench` prints.
#[derive(Serialize)]
pub struct BenchReport {
    /// Adapter name.
    pub adapter: String,
    /// Prompt tokens per sequence.
    pub prompt_tokens: usize,
    /// Generated tokens per sequence.
    pub gen_tokens: usize,
    /// Sequences per batch.
    pub concurrency: usize,
    /// Seconds to read the file and upload the weights.
    pub load_s: f64,
    /// Prompt tokens per second over all sequences (median run).
    pub prefill_tokens_per_s: f64,
    /// Seconds from the start of the prefill to the first sequence's first token (median run).
    pub time_to_first_token_s: f64,
    /// Generated tokens per second over all sequences, decode steps only (median run).
    pub decode_tokens_per_s: f64,
    /// Bytes of weights on the GPU (as in the file: weights stay quantized).
    pub weight_bytes: u64,
    /// Bytes of weights one decode step reads: every matrix, the token embedding only when it
    /// is also the output projection.
    pub weight_bytes_per_decode_step: u64,
    /// Bytes of the KV cache allocated for the run.
    pub kv_cache_bytes: u64,
    /// The most GPU memory flint's weights, KV cache and activations held at once.
    pub peak_gpu_bytes: u64,
    /// The fastest of the device's probes (a buffer copy, a buffer read, a read of weights as the
    /// products read them), bytes per second.
    pub roofline_bytes_per_s: f64,
    /// weight_bytes_per_decode_step × decode steps per second, over the roofline.
    pub roofline_fraction: f64,
    /// The faster of the buffer probes alone (copy and read of a storage buffer), bytes per
    /// second: where weights are read another way (textures, on CPU devices) it can be far below
    /// the roofline.
    pub buffer_probe_bytes_per_s: f64,
    /// The decode's weight reads over the buffer probes.
    pub buffer_probe_fraction: f64,
    /// Kernel dispatches one decode step records.
    pub dispatches_per_decode_step: f64,
    /// Of those, the ones inside transformer layers, per layer.
    pub dispatches_per_layer: f64,
    /// The rest: embedding, output norm and head.
    pub dispatches_outside_layers: f64,
    /// Transformer layers of the model.
    pub layers: usize,
    /// GPU objects one decode step creates once the decode runs (from its third step on, after
    /// the warm-up run).
    pub created_per_decode_step: CreatedPerStep,
    /// Milliseconds the host spends recording and submitting one decode step (its inputs
    /// uploaded, every dispatch recorded, the command buffer submitted; not the wait for the
    /// GPU nor the readback): the median over the measured runs' steps from the third on.
    pub host_ms_per_decode_step: f64,
}

/// GPU objects created per decode step, by kind (a mean over the first measured run's steps from
/// the third on; over its last when it has fewer).
#[derive(Clone, Copy, Serialize)]
pub struct CreatedPerStep {
    /// Buffers (tensors, parameter blocks, readback buffers come from a pool).
    pub buffers: f64,
    /// Bind groups (those the model's cache does not hold from earlier steps).
    pub bind_groups: f64,
    /// Compute pipelines.
    pub pipelines: f64,
}

/// Runs the benchmark on a loaded model.
pub fn run(
    file: &GgufFile,
    tokenizer: &Tokenizer,
    model: &Model,
    load_s: f64,
    options: &BenchOptions,
) -> anyhow::Result<BenchReport> {
    anyhow::ensure!(
        options.prompt_tokens >= 1 && options.gen_tokens >= 2,
        "--prompt-tokens must be >= 1 and --gen-tokens >= 2"
    );
    anyhow::ensure!(
        options.concurrency >= 1 && options.repeats >= 1,
        "--concurrency and --repeats must be >= 1"
    );
    let context = model.config().context_length;
    anyhow::ensure!(
        options.prompt_tokens + options.gen_tokens <= context,
        "--prompt-tokens + --gen-tokens ({}) exceed the model's context of {context} tokens",
        options.prompt_tokens + options.gen_tokens
    );
    let prompt = prompt_ids(tokenizer, options.prompt_tokens);
    let mut runs = Vec::with_capacity(options.repeats);
    let mut kv_cache_bytes = 0;
    for run in 0..=options.repeats {
        let (figures, kv_bytes) = one_run(model, &prompt, options)?;
        kv_cache_bytes = kv_bytes;
        // Run 0 warms up: pipelines compile and buffers zero-initialise on first use.
        if run > 0 {
            runs.push(figures);
        }
    }
    let median = |pick: fn(&RunFigures) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let prefill_s = median(|r| r.prefill_s);
    let decode_s = median(|r| r.decode_s);
    let total_prompt = (options.prompt_tokens * options.concurrency) as f64;
    let decode_steps = (options.gen_tokens - 1) as f64;

    let ctx = model.gpu();
    // Before the bandwidth probe's own buffers.
    let peak_gpu_bytes = ctx.memory_peak();
    let start = Instant::now();
    let now_s = || start.elapsed().as_secs_f64();
    let bandwidth = pollster::block_on(measure_bandwidth(ctx, 64 << 20, 9, &now_s))?;
    let weight_bytes: u64 = file.tensors().iter().map(|t| t.bytes() as u64).sum();
    let embedding_bytes = file.tensor("token_embd.weight").map_or(0, |t| t.bytes() as u64);
    let per_step = if model.config().tied_output { weight_bytes } else { weight_bytes - embedding_bytes };
    let steps_per_s = decode_steps / decode_s;
    let dispatches_per_decode_step = runs[0].decode_dispatches as f64 / decode_steps;
    let layer_dispatches_per_step = runs[0].decode_layer_dispatches as f64 / decode_steps;
    Ok(BenchReport {
        adapter: ctx.adapter_info().name.clone(),
        prompt_tokens: options.prompt_tokens,
        gen_tokens: options.gen_tokens,
        concurrency: options.concurrency,
        load_s,
        prefill_tokens_per_s: total_prompt / prefill_s,
        time_to_first_token_s: median(|r| r.first_token_s),
        decode_tokens_per_s: decode_steps * options.concurrency as f64 / decode_s,
        weight_bytes,
        weight_bytes_per_decode_step: per_step,
        kv_cache_bytes,
        peak_gpu_bytes,
        roofline_bytes_per_s: bandwidth.best_bytes_per_s(),
        roofline_fraction: per_step as f64 * steps_per_s / bandwidth.best_bytes_per_s(),
        buffer_probe_bytes_per_s: bandwidth.best_buffer_bytes_per_s(),
        buffer_probe_fraction: per_step as f64 * steps_per_s / bandwidth.best_buffer_bytes_per_s(),
        dispatches_per_decode_step,
        dispatches_per_layer: layer_dispatches_per_step / model.config().n_layers as f64,
        dispatches_outside_layers: dispatches_per_decode_step - layer_dispatches_per_step,
        layers: model.config().n_layers,
        created_per_decode_step: runs[0].created_per_decode_step,
        host_ms_per_decode_step: {
            let mut all: Vec<f64> = runs.iter().flat_map(|r| r.host_s_per_step.iter().copied()).collect();
            all.sort_by(f64::total_cmp);
            all.get(all.len() / 2).map_or(0.0, |s| s * 1e3)
        },
    })
}

struct RunFigures {
    prefill_s: f64,
    first_token_s: f64,
    decode_s: f64,
    decode_dispatches: u64,
    /// Of those, the ones inside transformer layers.
    decode_layer_dispatches: u64,
    /// GPU objects a decode step created, from the second step on.
    created_per_decode_step: CreatedPerStep,
    /// Seconds each decode step from the third on took to record and submit.
    host_s_per_step: Vec<f64>,
}

/// Real text for the prompt (the licence flint is tested on, else a fixed sentence), repeated
/// to the length asked for.
pub fn prompt_ids(tokenizer: &Tokenizer, tokens: usize) -> Vec<u32> {
    let text = std::fs::read_to_string("/usr/share/common-licenses/Apache-2.0")
        .unwrap_or_else(|_| "The quick brown fox jumps over the lazy dog. ".repeat(64));
    let ids = tokenizer.encode(&text, false, false);
    ids.iter().copied().cycle().take(tokens).collect()
}

/// One prefill of every sequence, then greedy decode steps of all of them as one batch.
fn one_run(model: &Model, prompt: &[u32], options: &BenchOptions) -> anyhow::Result<(RunFigures, u64)> {
    let ctx = model.gpu();
    let vocab = model.config().vocab_size;
    let per_sequence = prompt.len() + options.gen_tokens;
    let mut cache = model.new_kv_cache(Some(
        per_sequence.next_multiple_of(flint_core::model::KV_BLOCK_TOKENS) * options.concurrency,
    ))?;
    let kv_bytes = (cache.capacity_tokens() as u64)
        * cache.shape().token_bytes_per_layer()
        * 2
        * cache.shape().layers as u64;
    let mut tables: Vec<_> = (0..options.concurrency).map(|_| cache.new_sequence()).collect();
    for table in &mut tables {
        cache.append(table, prompt.len())?;
    }
    let started = Instant::now();
    let mut first_token_s = 0.0;
    let mut next = Vec::with_capacity(options.concurrency);
    for table in &tables {
        let row = pollster::block_on(prefill(model, &cache, table, prompt)?.to_f32(ctx))?;
        next.push(argmax(&row).unwrap_or(0));
        if next.len() == 1 {
            first_token_s = started.elapsed().as_secs_f64();
        }
    }
    let prefill_s = started.elapsed().as_secs_f64();

    let decode_started = Instant::now();
    let dispatches_before = ctx.dispatch_count();
    let layer_dispatches_before = ctx.layer_dispatch_count();
    // Creations and host time are counted after the first decode steps (as many of the
    // WARM_DECODE_STEPS as leave one to count): the first makes the buffers of the decode's shapes
    // again when the prefills left them idle long enough to be freed, and the pool's order of
    // handing them out, which the kept bind groups follow, settles by the second.
    let steps = options.gen_tokens - 1;
    let warm = WARM_DECODE_STEPS.min(steps - 1);
    let mut created_before = ctx.created();
    let mut host_s_per_step = Vec::with_capacity(steps);
    for step in 1..=steps {
        let recording = Instant::now();
        let logits = decode_step(model, &mut cache, &mut tables, &next)?;
        if step > warm {
            host_s_per_step.push(recording.elapsed().as_secs_f64());
        }
        let logits = pollster::block_on(logits.to_f32(ctx))?;
        next = logits.chunks_exact(vocab).map(|row| argmax(row).unwrap_or(0)).collect();
        if step == warm {
            created_before = ctx.created();
        }
    }
    let steady_steps = (steps - warm) as f64;
    let decode_s = decode_started.elapsed().as_secs_f64();
    let decode_dispatches = ctx.dispatch_count() - dispatches_before;
    let decode_layer_dispatches = ctx.layer_dispatch_count() - layer_dispatches_before;
    let created = ctx.created();
    let created_per_decode_step = CreatedPerStep {
        buffers: (created.buffers - created_before.buffers) as f64 / steady_steps,
        bind_groups: (created.bind_groups - created_before.bind_groups) as f64 / steady_steps,
        pipelines: (created.pipelines - created_before.pipelines) as f64 / steady_steps,
    };
    for table in tables {
        cache.release(table);
    }
    let figures = RunFigures {
        prefill_s,
        first_token_s,
        decode_s,
        decode_dispatches,
        decode_layer_dispatches,
        created_per_decode_step,
        host_s_per_step,
    };
    Ok((figures, kv_bytes))
}
