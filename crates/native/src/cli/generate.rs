//! `flint generate` (a prompt continued, or one JSON object) and `flint run` (one prompt
//! answered through the chat template), both through the engine.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use flint_native::{ChatMessage, EngineOptions, GenerateRequest, LLM, MetaInfo, Prompts, SamplingParams};

use super::model::{ChatTemplateArg, ModelArg};

/// How to choose tokens: the sampling flags of `generate`, `run` and `chat`.
#[derive(Args, Clone)]
pub struct SamplingArgs {
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
}

impl SamplingArgs {
    /// The engine's sampling parameters (the engine checks their ranges).
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            max_new_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

/// Structured output: at most one of a JSON Schema, a regex and a grammar the output must follow.
#[derive(Args, Clone)]
#[group(multiple = false)]
pub struct OutputConstraintArgs {
    /// The output is JSON valid against the JSON Schema in this file.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// The whole output matches this regular expression (Rust regex syntax).
    #[arg(long, value_name = "PATTERN")]
    regex: Option<String>,
    /// The output follows the Lark grammar in this file (llguidance's syntax; `start` is the
    /// output).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

impl OutputConstraintArgs {
    /// `params` with the constraint (the engine compiles it and names what is wrong).
    pub fn apply(&self, params: SamplingParams) -> anyhow::Result<SamplingParams> {
        let grammar = match &self.grammar {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read the grammar file {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let json_schema = self.json_schema.as_deref().map(read_json_schema).transpose()?;
        Ok(SamplingParams { json_schema, regex: self.regex.clone(), grammar, ..params })
    }
}

/// The JSON Schema in the file at `path`.
pub fn read_json_schema(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read the JSON Schema file {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("the JSON Schema file {} is not JSON: {e}", path.display()))
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    chat_template: ChatTemplateArg,
    /// The prompt text.
    #[arg(long, value_name = "P", required_unless_present = "input_ids", conflicts_with = "input_ids")]
    prompt: Option<String>,
    /// The prompt as token ids, a JSON array such as `[504, 3575]`, used as given.
    #[arg(long, value_name = "JSON")]
    input_ids: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    constraint: OutputConstraintArgs,
    /// Wrap the prompt as a user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object with text, output_ids and meta_info instead of streaming.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    chat_template: ChatTemplateArg,
    /// The prompt; read from standard input when not given.
    prompt: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    constraint: OutputConstraintArgs,
    /// Continue the prompt as plain text instead of answering it through the chat template.
    #[arg(long)]
    raw: bool,
}

/// The engine as the command-line program runs it: requests without a seed differ between runs.
pub fn engine_options() -> EngineOptions {
    EngineOptions { seed: fresh_seed(), ..EngineOptions::default() }
}

pub fn generate(args: &GenerateArgs, quiet: bool) -> anyhow::Result<()> {
    let sampling = args.constraint.apply(args.sampling.params())?;
    let llm = args.model.load_llm(engine_options(), &args.chat_template, quiet)?;
    let prompt_ids: Vec<u32> = match (&args.input_ids, &args.prompt) {
        (Some(json), _) => serde_json::from_str(json)
            .map_err(|e| anyhow::anyhow!("--input-ids must be a JSON array of token ids: {e}"))?,
        (None, Some(prompt)) if args.chat => llm.encode_chat(&[ChatMessage::user(prompt.as_str())])?,
        (None, Some(prompt)) => llm.tokenizer().encode(prompt, true, false),
        (None, None) => anyhow::bail!("give --prompt or --input-ids"),
    };
    let request =
        GenerateRequest { input_ids: Some(Prompts::One(prompt_ids)), sampling, ..GenerateRequest::default() };
    let mut out = std::io::stdout().lock();
    if args.json {
        let output = llm.generate(request)?;
        let report = serde_json::json!({
            "text": output.text,
            "output_ids": output.output_ids,
            "meta_info": output.meta_info,
        });
        writeln!(out, "{report}")?;
    } else {
        stream_text(&llm, request, &mut out)?;
        writeln!(out)?;
    }
    Ok(())
}

pub fn run(args: &RunArgs, quiet: bool) -> anyhow::Result<()> {
    let prompt = match &args.prompt {
        Some(prompt) => prompt.clone(),
        None => read_stdin_prompt()?,
    };
    let sampling = args.constraint.apply(args.sampling.params())?;
    let llm = args.model.load_llm(engine_options(), &args.chat_template, quiet)?;
    let prompt_ids = match llm.chat_template() {
        Ok(_) if !args.raw => llm.encode_chat(&[ChatMessage::user(prompt)])?,
        _ => llm.tokenizer().encode(&prompt, true, false),
    };
    let request =
        GenerateRequest { input_ids: Some(Prompts::One(prompt_ids)), sampling, ..GenerateRequest::default() };
    let mut out = std::io::stdout().lock();
    stream_text(&llm, request, &mut out)?;
    writeln!(out)?;
    Ok(())
}

/// Streams the request's text to `out` as it comes; returns the whole text and the last
/// item's meta info.
pub fn stream_text(
    llm: &LLM,
    request: GenerateRequest,
    out: &mut impl Write,
) -> anyhow::Result<(String, MetaInfo)> {
    let mut text = String::new();
    let mut meta = None;
    for piece in llm.generate_stream(request) {
        let piece = piece?;
        out.write_all(piece.text.as_bytes())?;
        out.flush()?;
        text.push_str(&piece.text);
        meta = Some(piece.meta_info);
    }
    let meta = meta.ok_or_else(|| anyhow::anyhow!("the engine ended the request without an output"))?;
    Ok((text, meta))
}

/// The prompt from standard input (all of it, without its final newline).
fn read_stdin_prompt() -> anyhow::Result<String> {
    let mut stdin = std::io::stdin().lock();
    anyhow::ensure!(!stdin.is_terminal(), "give the prompt as an argument, or pipe it to standard input");
    let mut bytes = Vec::new();
    stdin.read_to_end(&mut bytes)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "standard input is not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    let prompt = text.strip_suffix('\n').unwrap_or(&text).to_string();
    anyhow::ensure!(!prompt.trim().is_empty(), "the prompt on standard input is empty");
    Ok(prompt)
}

/// A seed from the OS's per-process hash keys: sampling without `--seed` differs between runs.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}
