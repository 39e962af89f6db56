//! `flint synth`: writes a synthetic model (random weights at a named real model's shapes,
//! metadata and tensor types; `flint_core::synth`) for measuring speed, memory and loading
//! where the real model cannot be downloaded.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use flint_core::synth::{QuantMix, SHAPES, shape, write_model};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Args)]
pub struct SynthArgs {
    /// The model whose shapes to copy, e.g. llama-3.2-1b (`--list` names them all).
    #[arg(long, value_name = "NAME", required_unless_present = "list")]
    model: Option<String>,
    /// Tensor types, as llama.cpp's quantizer chooses them: f16, q8_0, q4_0 or q4_k_m.
    #[arg(long, default_value = "q4_k_m", value_name = "MIX")]
    quant: String,
    /// Seed of the random weights and vocabulary: the same seed writes the same file.
    #[arg(long, default_value_t = 1, value_name = "N")]
    seed: u64,
    /// Where to write the file; by default `<model>.<quant>.synthetic.gguf` here.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// List the models and their sizes in each mix, and write nothing.
    #[arg(long)]
    list: bool,
}

pub fn synth(args: &SynthArgs, quiet: bool) -> anyhow::Result<()> {
    let mix = QuantMix::from_name(&args.quant)?;
    if args.list {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{:<14} {:>14} {:>10}", "model", "parameters", args.quant)?;
        for shape in SHAPES {
            let gib = shape.data_bytes(mix) as f64 / (1u64 << 30) as f64;
            writeln!(out, "{:<14} {:>14} {:>6.2} GiB", shape.name, shape.parameters(), gib)?;
        }
        return Ok(());
    }
    let name = args.model.as_deref().unwrap_or_default();
    let shape = shape(name)?;
    let path =
        args.output.clone().unwrap_or_else(|| PathBuf::from(format!("{name}.{}.synthetic.gguf", args.quant)));
    let file = std::fs::File::create(&path).with_context(|| format!("cannot create '{}'", path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let style = ProgressStyle::with_template("writing {prefix} [{bar:30}] {bytes}/{total_bytes} ({eta})")
            .map_or_else(|_| ProgressStyle::default_bar(), |style| style.progress_chars("=> "));
        ProgressBar::new(shape.data_bytes(mix) as u64)
            .with_style(style)
            .with_prefix(path.display().to_string())
    });
    let started = Instant::now();
    write_model(shape, mix, args.seed, &mut out, |written, _| {
        if let Some(bar) = &bar {
            bar.set_position(written);
        }
    })
    .and_then(|()| out.flush())
    .with_context(|| format!("cannot write '{}'", path.display()))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if !quiet {
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        eprintln!(
            "wrote {} ({:.2} GiB, {} parameters) in {:.1} s",
            path.display(),
            bytes as f64 / (1u64 << 30) as f64,
            shape.parameters(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
