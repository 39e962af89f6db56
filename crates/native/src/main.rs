//! `flint`: the command-line program.
//!
//! Each subcommand is a variant of [`Command`] and one function here. Errors print as one line
//! on stderr and exit with status 1; usage errors are clap's (status 2).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use std::time::Instant;

use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::kernels::copy::measure_bandwidth;
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
    /// Print the token ids of a text as a JSON array.
    Tokenize(TokenizeArgs),
    /// Describe the GPU flint would use and measure its memory bandwidth.
    Gpu(GpuArgs),
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect(&args),
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
