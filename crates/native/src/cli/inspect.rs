//! `flint inspect` and `flint tokenize`: what a GGUF file holds, read on the CPU (no GPU).

use std::io::{Read, Write};

use clap::Args;
use flint_core::gguf::GgufFile;
use flint_core::tokenizer::Tokenizer;

use super::model::ModelArg;

#[derive(Args)]
pub struct InspectArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArg,
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

pub fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let summary = GgufFile::open(args.model.path()?)?.summary()?;
    let text = if args.json { serde_json::to_string_pretty(&summary)? + "\n" } else { summary.to_string() };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

pub fn tokenize(args: &TokenizeArgs) -> anyhow::Result<()> {
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(args.model.path()?)?)?;
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
