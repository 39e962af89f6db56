//! `flint inspect` and `flint tokenize`: what a GGUF file holds, read on the CPU, and the memory
//! plan of its model on the current GPU adapter.

use std::io::{Read, Write};

use clap::Args;
use flint_core::gguf::GgufFile;
use flint_core::gpu::GpuContext;
use flint_core::model::MemoryPlan;
use flint_core::tokenizer::Tokenizer;
use flint_native::EngineOptions;

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
    let file = GgufFile::open(args.model.path()?)?;
    let summary = file.summary()?;
    // The plan, or why there is none (no adapter, or a model that does not fit): the summary
    // is printed either way.
    let plan = plan(args, &file);
    let text = if args.json {
        let mut json = serde_json::to_value(&summary)?;
        let (plan, error) = match &plan {
            Ok(plan) => (serde_json::to_value(plan)?, serde_json::Value::Null),
            Err(error) => (serde_json::Value::Null, error.to_string().into()),
        };
        json["memory_plan"] = plan;
        json["memory_plan_error"] = error;
        serde_json::to_string_pretty(&json)? + "\n"
    } else {
        let plan = match &plan {
            Ok(plan) => plan.to_string(),
            Err(error) => format!("memory plan: {error}"),
        };
        format!("{summary}{plan}\n")
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

/// The model's memory plan on the adapter a run would use, for an engine of the default options
/// with `--ctx-size` and `--gpu-memory-budget`.
fn plan(args: &InspectArgs, file: &GgufFile) -> anyhow::Result<MemoryPlan> {
    let ctx = pollster::block_on(GpuContext::new(&args.model.gpu_options()))?;
    let options = args.model.engine_options(EngineOptions::default());
    let plan = MemoryPlan::new(&ctx, file, &options.plan_request())?;
    Ok(plan)
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
