//! `flint`: the command-line program.
//!
//! Each subcommand is a variant of [`Command`] and one function here. Errors print as one line
//! on stderr and exit with status 1; usage errors are clap's (status 2).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

mod bench;
mod engine_bench;

use clap::{Args, Parser, Subcommand};
use std::time::Instant;

use flint_core::chat::{ChatMessage, ChatTemplate};
use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::kernels::copy::measure_bandwidth;
use flint_core::model::Model;
use flint_core::sample::SamplingParams;
use flint_core::tokenizer::Tokenizer;

#[derive(Parser)]
#[command(name = "flint", version, about = "Run large language models from GGUF files on any GPU.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a model's architecture, hyper-parameters, tokenizer and tensors.
    Inspect(InspectArgs),
    /// Continue a prompt (streamed to standard output, or one JSON object with --json).
    Generate(GenerateArgs),
    /// Measure prefill and decode speed beside the device's memory roofline.
    Bench(BenchArgs),
    /// Perplexity of a text file, as llama.cpp's reference defines it.
    Perplexity(PerplexityArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(TokenizeArgs),
    /// Describe the GPU flint would use and measure its memory bandwidth.
    Gpu(GpuArgs),
}

#[derive(Args)]
struct GenerateArgs {
    /// The GGUF model file.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// The prompt text.
    #[arg(long, value_name = "P", required_unless_present = "input_ids", conflicts_with = "input_ids")]
    prompt: Option<String>,
    /// The prompt as token ids, a JSON array such as `[504, 3575]`, used as given.
    #[arg(long, value_name = "JSON")]
    input_ids: Option<String>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128, value_name = "N")]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0, value_name = "X")]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass, in (0, 1].
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    top_p: f32,
    /// Keep the K most likely tokens; -1 keeps all.
    #[arg(long, default_value_t = -1, value_name = "K", allow_negative_numbers = true)]
    top_k: i32,
    /// Drop tokens less likely than this fraction of the most likely one, in [0, 1].
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    min_p: f32,
    /// Seed of the sampler, for reproducible output.
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Wrap the prompt as a user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object with text, output_ids and meta_info instead of streaming.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchArgs {
    /// The GGUF model file.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
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
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PerplexityArgs {
    /// The GGUF model file.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// The text file to score.
    #[arg(long, value_name = "TEXT")]
    file: PathBuf,
    /// Tokens per window.
    #[arg(long, value_name = "N")]
    ctx: usize,
    /// Windows to evaluate at most (default: as many as the text holds).
    #[arg(long, value_name = "W")]
    windows: Option<usize>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TokenizeArgs {
    /// The GGUF model file whose tokenizer to use.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// The text; read from standard input when not given.
    #[arg(long, value_name = "T")]
    text: Option<String>,
    /// Add the model's special tokens (BOS where the model's metadata asks for it).
    #[arg(long)]
    add_special: bool,
    /// Match special-token text such as `<|im_start|>` as the special token itself.
    #[arg(long)]
    parse_special: bool,
}

#[derive(Args)]
struct GpuArgs {
    /// Size of the bandwidth probe buffer in MiB (0 skips the measurement).
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    probe_mib: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct InspectArgs {
    /// The GGUF model file.
    #[arg(long, value_name = "FILE")]
    model: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    quiet_wayland_probe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect(&args),
        Command::Generate(args) => generate(&args),
        Command::Bench(args) => bench_command(&args),
        Command::Perplexity(args) => perplexity(&args),
        Command::Tokenize(args) => tokenize(&args),
        Command::Gpu(args) => gpu(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let summary = GgufFile::open(&args.model)?.summary()?;
    let text = if args.json { serde_json::to_string_pretty(&summary)? + "\n" } else { summary.to_string() };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

/// The model file, its tokenizer and the model on the GPU.
fn load(path: &std::path::Path) -> anyhow::Result<(GgufFile, Tokenizer, Model)> {
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let ctx = pollster::block_on(GpuContext::new(&GpuOptions::from_env()))?;
    let model = Model::load(ctx, &file)?;
    Ok((file, tokenizer, model))
}

fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let (file, tokenizer, model) = load(&args.model)?;
    // The request's latency, as the engine will report it: from the prompt to the last token.
    let started = Instant::now();
    let prompt_ids: Vec<u32> = match (&args.input_ids, &args.prompt) {
        (Some(json), _) => serde_json::from_str(json)
            .map_err(|e| anyhow::anyhow!("--input-ids must be a JSON array of token ids: {e}"))?,
        (None, Some(prompt)) if args.chat => {
            let template = ChatTemplate::from_gguf(&file, &tokenizer)?.ok_or_else(|| {
                anyhow::anyhow!("--chat: this model's file has no chat template (tokenizer.chat_template)")
            })?;
            let text = template.render(&[ChatMessage::user(prompt.as_str())], true)?;
            // Templates that write the BOS token themselves must not get a second one.
            let bos_text = tokenizer.bos().and_then(|id| tokenizer.token_text(id)).unwrap_or_default();
            let add_bos = bos_text.is_empty() || !text.starts_with(bos_text);
            tokenizer.encode(&text, add_bos, true)
        }
        (None, Some(prompt)) => tokenizer.encode(prompt, true, false),
        (None, None) => anyhow::bail!("give --prompt or --input-ids"),
    };
    let params = SamplingParams {
        max_new_tokens: args.max_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        seed: args.seed,
        ..SamplingParams::default()
    };
    let mut out = std::io::stdout().lock();
    let mut write_error = None;
    let mut on_text = |text: &str, _: &[u32]| {
        if !args.json && write_error.is_none() && !text.is_empty() {
            write_error = out.write_all(text.as_bytes()).and_then(|()| out.flush()).err();
        }
    };
    let generation = pollster::block_on(flint_core::generate::generate(
        &model,
        &tokenizer,
        &prompt_ids,
        params,
        fresh_seed(),
        &mut on_text,
    ))?;
    if let Some(error) = write_error {
        return Err(error.into());
    }
    if args.json {
        let report = serde_json::json!({
            "text": generation.text,
            "output_ids": generation.output_ids,
            "meta_info": {
                "id": format!("{:016x}", fresh_seed()),
                "prompt_tokens": generation.prompt_tokens,
                "completion_tokens": generation.completion_tokens,
                "cached_tokens": 0,
                "finish_reason": generation.finish_reason,
                "e2e_latency": started.elapsed().as_secs_f64(),
            },
        });
        writeln!(out, "{report}")?;
    } else {
        writeln!(out)?;
    }
    Ok(())
}

fn bench_command(args: &BenchArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let (file, tokenizer, model) = load(&args.model)?;
    let load_s = started.elapsed().as_secs_f64();
    if !args.streams.is_empty() {
        return engine_bench_command(args, tokenizer, model);
    }
    let options = bench::BenchOptions {
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        concurrency: args.concurrency,
        repeats: args.repeats,
    };
    let r = bench::run(&file, &tokenizer, &model, load_s, &options)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
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
        "memory:         weights {:.1} MiB, KV cache {:.1} MiB",
        r.weight_bytes as f64 / 1048576.0,
        r.kv_cache_bytes as f64 / 1048576.0
    )?;
    writeln!(
        out,
        "roofline:       {:.1} MB of weights per decode step, {:.2} GB/s device probe: {:.1}% of it",
        r.weight_bytes_per_decode_step as f64 / 1e6,
        r.roofline_bytes_per_s / 1e9,
        r.roofline_fraction * 100.0
    )?;
    writeln!(
        out,
        "dispatches:     {:.0} per decode step, {:.1} per layer",
        r.dispatches_per_decode_step, r.dispatches_per_layer
    )?;
    Ok(())
}

fn engine_bench_command(args: &BenchArgs, tokenizer: Tokenizer, model: Model) -> anyhow::Result<()> {
    let adapter = model.gpu().adapter_info().name.clone();
    let prompt = bench::prompt_ids(&tokenizer, args.prompt_tokens);
    let most = args.streams.iter().copied().max().unwrap_or(1);
    let (engine, step_loop) =
        engine_bench::start(model, tokenizer, most, args.prompt_tokens + args.gen_tokens)?;
    let reports = engine_bench::run(&engine, &prompt, args.gen_tokens, &args.streams, args.repeats);
    drop(engine);
    step_loop.join().map_err(|_| anyhow::anyhow!("the engine's step loop panicked"))?;
    let reports = reports?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = serde_json::json!({
            "adapter": adapter,
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "repeats": args.repeats,
            "streams": reports,
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
    writeln!(out, "{:>8} {:>16} {:>12} {:>16}", "streams", "decode tok/s", "vs 1 stream", "first token s")?;
    for r in &reports {
        let ratio = r.ratio_to_one_stream.map_or("-".to_string(), |x| format!("{x:.2}x"));
        writeln!(
            out,
            "{:>8} {:>16.2} {:>12} {:>16.3}",
            r.streams, r.decode_tokens_per_s, ratio, r.time_to_first_token_s
        )?;
    }
    Ok(())
}

fn perplexity(args: &PerplexityArgs) -> anyhow::Result<()> {
    let (_, tokenizer, model) = load(&args.model)?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read '{}': {e}", args.file.display()))?;
    let ids = tokenizer.encode(&text, false, false);
    // Progress on a terminal only: redirected stderr gets no carriage-return noise.
    let show_progress = std::io::stderr().is_terminal();
    let mut on_window = |done: usize, total: usize| {
        if show_progress {
            eprint!("\rperplexity: window {done}/{total}");
        }
    };
    let result = pollster::block_on(flint_core::generate::perplexity(
        &model,
        &ids,
        args.ctx,
        args.windows.unwrap_or(usize::MAX),
        &mut on_window,
    ))?;
    if show_progress {
        eprintln!();
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&result)?)?;
    } else {
        writeln!(
            out,
            "perplexity {:.4} over {} tokens ({} windows of {})",
            result.ppl, result.scored_tokens, result.windows, result.ctx
        )?;
    }
    Ok(())
}

/// wgpu enables Vulkan's Wayland surface extension, and Mesa's drivers then probe for a Wayland
/// display; libwayland prints "XDG_RUNTIME_DIR is invalid or not set" to stderr when that
/// variable is unset, as on servers and in CI. flint opens no window: with the variable pointing
/// at the temp directory the probe finds no display and stays quiet.
fn quiet_wayland_probe() {
    if cfg!(target_os = "linux") && std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // SAFETY: called first thing in main, before any other thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}

/// A seed from the OS's per-process hash keys: sampling without `--seed` differs between runs.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

fn tokenize(args: &TokenizeArgs) -> anyhow::Result<()> {
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&args.model)?)?;
    let text = match &args.text {
        Some(text) => text.clone(),
        None => {
            let mut bytes = Vec::new();
            std::io::stdin().lock().read_to_end(&mut bytes)?;
            String::from_utf8(bytes).map_err(|e| {
                anyhow::anyhow!(
                    "standard input is not valid UTF-8 (first bad byte at offset {})",
                    e.utf8_error().valid_up_to()
                )
            })?
        }
    };
    let ids = tokenizer.encode(&text, args.add_special, args.parse_special);
    writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(&ids)?)?;
    Ok(())
}

fn gpu(args: &GpuArgs) -> anyhow::Result<()> {
    let ctx = pollster::block_on(GpuContext::new(&GpuOptions::from_env()))?;
    let device = ctx.describe();
    let bandwidth = if args.probe_mib == 0 {
        None
    } else {
        let start = Instant::now();
        let now_s = || start.elapsed().as_secs_f64();
        Some(pollster::block_on(measure_bandwidth(&ctx, args.probe_mib << 20, 9, &now_s))?)
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = serde_json::json!({ "device": device, "bandwidth": bandwidth });
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    writeln!(out, "adapter:   {} ({}, {})", device.adapter, device.backend, device.device_type)?;
    writeln!(out, "driver:    {}", device.driver)?;
    let f = device.features;
    writeln!(
        out,
        "features:  subgroups={} shader-f16={} timestamps={}",
        f.subgroups, f.shader_f16, f.timestamps
    )?;
    writeln!(
        out,
        "limits:    storage binding {} MiB, buffer {} MiB, workgroup memory {} KiB",
        device.max_storage_binding_bytes >> 20,
        device.max_buffer_bytes >> 20,
        device.max_workgroup_storage_bytes >> 10
    )?;
    if let Some(b) = bandwidth {
        writeln!(
            out,
            "bandwidth: copy {:.2} GB/s (read+write), read {:.2} GB/s, on {} MiB",
            b.copy_bytes_per_s / 1e9,
            b.read_bytes_per_s / 1e9,
            b.buffer_bytes >> 20
        )?;
    }
    Ok(())
}

/// The error and its causes on one line, each cause added only when the text so far does not
/// already say it (flint's I/O errors quote their OS error, which is also their source).
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line.replace('\n', " ")
}
