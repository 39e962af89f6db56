//! Which model a command uses (`--model`, else the default model from the cache), the chat
//! template the chatting commands may give in place of its own (`--chat-template-file`), and
//! loading it with a progress bar on a terminal.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use flint_core::gguf::GgufFile;
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::model::Model;
use flint_core::tokenizer::Tokenizer;
use flint_native::{EngineOptions, Error, LLM, LoadOptions, LoadStage};
use indicatif::{ProgressBar, ProgressStyle};

/// The file name of the default model, SmolLM2-135M-Instruct in Q4_1.
const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `--model FILE`, optional: the default model from the cache directory when absent.
#[derive(Args, Clone)]
pub struct ModelArg {
    /// The GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from $FLINT_MODEL_DIR, else
    /// ~/.cache/flint/models, where scripts/fetch-models.sh puts it).
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
    /// MiB of GPU memory that the weights, KV cache and activations may hold at most; a step
    /// that would go past it fails its requests with an out-of-memory error (default: no limit).
    #[arg(long, value_name = "MIB")]
    gpu_memory_budget: Option<u64>,
    /// Tokens the KV cache holds over all sequences (default: as many as the memory plan finds
    /// room for, up to the model's context, or 2 GiB of cache where the GPU's memory is not
    /// known; `flint inspect` prints the plan).
    #[arg(long, value_name = "N")]
    ctx_size: Option<usize>,
}

/// `--chat-template-file PATH`, for the commands that render chats.
#[derive(Args, Clone)]
pub struct ChatTemplateArg {
    /// A Jinja chat template to use in place of the model file's own (tokenizer.chat_template),
    /// for a model whose file has none or a wrong one, as llama.cpp's --chat-template-file; it
    /// is given messages, tools (when a request offers some), add_generation_prompt, bos_token and
    /// eos_token.
    #[arg(long, value_name = "PATH")]
    chat_template_file: Option<PathBuf>,
}

impl ChatTemplateArg {
    /// The template's source, when a file was given.
    fn read(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.chat_template_file else { return Ok(None) };
        let source = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the chat template file {}: {e}", path.display()))?;
        Ok(Some(source))
    }
}

impl ModelArg {
    /// The model file to use.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        if let Some(path) = &self.model {
            return Ok(path.clone());
        }
        let path = model_dir().join(DEFAULT_MODEL_FILE);
        anyhow::ensure!(
            path.is_file(),
            "no --model given and the default model {} is missing: run scripts/fetch-models.sh smollm2 \
             to fetch it, or pass --model FILE",
            path.display()
        );
        Ok(path)
    }

    /// `engine` with the KV cache size of `--ctx-size`, when given.
    pub fn engine_options(&self, engine: EngineOptions) -> EngineOptions {
        EngineOptions { kv_cache_tokens: self.ctx_size.or(engine.kv_cache_tokens), ..engine }
    }

    /// The GPU to open: from the environment ([`GpuOptions::from_env`]), with the budget.
    pub fn gpu_options(&self) -> GpuOptions {
        GpuOptions { memory_budget: self.gpu_memory_budget.map(|mib| mib << 20), ..GpuOptions::from_env() }
    }

    /// Loads the model with `chat_template`'s template, if given, in place of its own and
    /// starts its engine, with a progress bar on a terminal unless `quiet`.
    pub fn load_llm(
        &self,
        engine: EngineOptions,
        chat_template: &ChatTemplateArg,
        quiet: bool,
    ) -> anyhow::Result<LLM> {
        let engine = self.engine_options(engine);
        let path = self.path()?;
        // Read before the model: a wrong path fails at once.
        let template = chat_template.read()?;
        let progress = LoadProgress::start(&path, quiet);
        let on_progress = progress.clone().map(|bar| Box::new(move |stage| bar.stage(stage)) as Box<_>);
        let options = LoadOptions { engine, gpu: self.gpu_options(), on_progress, chat_template: template };
        let llm = LLM::load(&path, options);
        if let Some(bar) = progress {
            bar.finish();
        }
        llm.map_err(|error| match (&error, &chat_template.chat_template_file) {
            // At load, only the given template can be at fault: name its file.
            (Error::Core(flint_core::Error::ChatTemplate(_)), Some(file)) => {
                anyhow::Error::new(error).context(format!("--chat-template-file {}", file.display()))
            }
            _ => error.into(),
        })
    }

    /// The model file, its tokenizer and the model on the GPU, without an engine (for the
    /// commands that measure the model itself).
    pub fn load_model(&self, quiet: bool) -> anyhow::Result<(GgufFile, Tokenizer, Model)> {
        let path = self.path()?;
        let progress = LoadProgress::start(&path, quiet);
        let stage = |stage| {
            if let Some(bar) = &progress {
                bar.stage(stage);
            }
        };
        let loaded = (|| {
            stage(LoadStage::ReadingFile);
            let file = GgufFile::open(&path)?;
            let tokenizer = Tokenizer::from_gguf(&file)?;
            stage(LoadStage::OpeningGpu);
            let ctx = pollster::block_on(GpuContext::new(&self.gpu_options()))?;
            stage(LoadStage::UploadingWeights);
            let model = Model::load(ctx, &file)?;
            anyhow::Ok((file, tokenizer, model))
        })();
        if let Some(bar) = progress {
            bar.finish();
        }
        loaded
    }
}

/// The folder the models are fetched into, as `scripts/fetch-models.sh` chooses it:
/// `$FLINT_MODEL_DIR`, else `${XDG_CACHE_HOME:-~/.cache}/flint/models`.
fn model_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
    var("FLINT_MODEL_DIR").unwrap_or_else(|| {
        let cache = var("XDG_CACHE_HOME")
            .or_else(|| var("HOME").map(|home| home.join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"));
        cache.join("flint").join("models")
    })
}

/// A progress bar over the stages of loading a model, drawn on standard error (clones draw
/// the same bar).
#[derive(Clone)]
struct LoadProgress {
    bar: ProgressBar,
}

impl LoadProgress {
    /// A bar, when standard error is a terminal and the user did not ask for quiet.
    fn start(path: &Path, quiet: bool) -> Option<Self> {
        if quiet || !std::io::stderr().is_terminal() {
            return None;
        }
        let style = ProgressStyle::with_template("{spinner} loading {prefix} [{bar:20}] {msg} ({elapsed})")
            .map_or_else(|_| ProgressStyle::default_bar(), |style| style.progress_chars("=> "));
        let bar = ProgressBar::new(3).with_style(style);
        bar.set_prefix(
            path.file_name().map_or_else(|| path.display().to_string(), |n| n.display().to_string()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Some(LoadProgress { bar })
    }

    fn stage(&self, stage: LoadStage) {
        let (done, what) = match stage {
            LoadStage::ReadingFile => (0, "reading the file".to_string()),
            LoadStage::OpeningGpu => (1, "opening the GPU".to_string()),
            LoadStage::UploadingWeights => (2, "uploading the weights".to_string()),
            LoadStage::WeightsUploaded { bytes, total } => {
                let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
                (2, format!("uploading the weights: {:.0} of {:.0} MiB", mib(bytes), mib(total)))
            }
            _ => (3, "ready".to_string()),
        };
        self.bar.set_position(done);
        self.bar.set_message(what);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
