//! `flint`: the command-line program.
//!
//! Each subcommand is a variant of [`Command`] and a module of `cli/`. Errors print as one line
//! on stderr and exit with status 1; usage errors are clap's (status 2).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

use cli::bench::BenchArgs;
use cli::chat::ChatArgs;
use cli::generate::{GenerateArgs, RunArgs};
use cli::gpu::GpuArgs;
use cli::inspect::{InspectArgs, TokenizeArgs};
use cli::perplexity::PerplexityArgs;
use cli::serve::ServeArgs;
use cli::synth::SynthArgs;

#[derive(Parser)]
#[command(name = "flint", version, about = "Run large language models from GGUF files on any GPU.")]
struct Cli {
    /// No progress bar and no statistics on standard error (errors are still printed).
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer one prompt through the model's chat template, streamed to standard output.
    Run(RunArgs),
    /// Chat with the model: one message per line; /reset starts over, /exit ends.
    Chat(ChatArgs),
    /// Serve the model over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions).
    Serve(ServeArgs),
    /// Continue a prompt (streamed to standard output, or one JSON object with --json).
    Generate(GenerateArgs),
    /// Print a model's architecture, hyper-parameters, tokenizer and tensors.
    Inspect(InspectArgs),
    /// Measure prefill and decode speed beside the device's memory roofline.
    Bench(BenchArgs),
    /// Perplexity of a text file, as llama.cpp's reference defines it.
    Perplexity(PerplexityArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(TokenizeArgs),
    /// Describe the GPU flint would use and measure its memory bandwidth.
    Gpu(GpuArgs),
    /// Write a synthetic model: random weights at the shapes and types of a named real model.
    Synth(SynthArgs),
}

fn main() -> ExitCode {
    quiet_wayland_probe();
    let cli = Cli::parse();
    let quiet = cli.quiet;
    let result = match cli.command {
        Command::Run(args) => cli::generate::run(&args, quiet),
        Command::Chat(args) => cli::chat::chat(&args, quiet),
        Command::Serve(args) => cli::serve::serve(&args, quiet),
        Command::Generate(args) => cli::generate::generate(&args, quiet),
        Command::Inspect(args) => cli::inspect::inspect(&args),
        Command::Bench(args) => cli::bench::command(&args, quiet),
        Command::Perplexity(args) => cli::perplexity::perplexity(&args, quiet),
        Command::Tokenize(args) => cli::inspect::tokenize(&args),
        Command::Gpu(args) => cli::gpu::gpu(&args),
        Command::Synth(args) => cli::synth::synth(&args, quiet),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
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
