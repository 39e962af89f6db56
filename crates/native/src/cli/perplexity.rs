//! `flint perplexity`: perplexity of a text file over consecutive windows, as llama.cpp's
//! reference defines it.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;

use super::model::ModelArg;

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArg,
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

pub fn perplexity(args: &PerplexityArgs, quiet: bool) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read '{}': {e}", args.file.display()))?;
    let (_, tokenizer, model) = args.model.load_model(quiet)?;
    let ids = tokenizer.encode(&text, false, false);
    // Progress on a terminal only: redirected stderr gets no carriage-return noise.
    let show_progress = !quiet && std::io::stderr().is_terminal();
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
