//! The one error type of flint-web. Every error reaches JavaScript as an `Error` whose message
//! (wasm-bindgen's `JsError` from its `Display`) says what went wrong (and, for a bad parameter, which one): never as a wasm trap.

/// What can go wrong in the bindings.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The engine refused or failed (a bad model file, no WebGPU adapter, a parameter out of
    /// range, a lost device...): its message names the field or the file.
    #[error(transparent)]
    Core(#[from] flint_core::Error),
    /// A parameter object could not be read: the wrong type, an unknown field.
    #[error("invalid '{field}': {reason}")]
    InvalidParameter {
        /// Where in the object, as a path (`temperature`, `messages[1].role`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The model's bytes could not be read from its source (a failed download, a file gone).
    #[error("cannot read the model: {0}")]
    Source(String),
    /// The model was unloaded (or failed to load): no request can reach it.
    #[error("the engine was unloaded: load the model again")]
    Unloaded,
    /// An output could not be written as JSON.
    #[error("cannot write the output as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// `next()` was called on a stream while an earlier `next()` was still pending.
    #[error("a stream's next() was called again before the previous one settled")]
    ConcurrentNext,
}

impl Error {
    /// The error for a parameter `field` that is wrong for `reason`.
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidParameter { field: field.into(), reason: reason.into() }
    }
}

/// A `Result` of flint-web.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads `json` into a `T`, naming the field that is wrong (`serde_json` alone does not for a
/// value of the wrong type). `what` names the whole object in the message of a syntax error.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(json: &str, what: &str) -> Result<T> {
    let mut deserializer = serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let field = if path == "." { what.to_string() } else { path };
        Error::invalid(field, error.into_inner().to_string())
    })
}
