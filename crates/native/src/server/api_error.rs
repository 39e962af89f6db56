//! Errors as OpenAI's API writes them: a status and `{"error": {"message", "type", "param",
//! "code"}}`, so that OpenAI clients raise the matching exception with the message.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or a parameter is out of range (`param` names it).
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// With an OpenAI error code (`request_too_large`, `not_found`...).
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// With another status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// 404 for a path the server does not have.
    pub fn not_found(path: &str) -> Self {
        ApiError::invalid(
            format!(
                "no such endpoint: {path}; flint serves /v1/chat/completions, /v1/completions, /v1/models"
            ),
            None,
        )
        .with_status(StatusCode::NOT_FOUND)
        .with_code("not_found")
    }

    /// The error object alone, as a streamed response sends it in a `data:` event.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<crate::Error> for ApiError {
    fn from(error: crate::Error) -> Self {
        use crate::Error as Native;
        use flint_core::Error as Core;
        let message = error.to_string();
        match &error {
            Native::Core(Core::InvalidParameter { field, .. }) => {
                ApiError::invalid(message, Some(flint_core::openai::field_name(field)))
            }
            Native::Core(Core::TokenOutOfVocabulary { .. }) => ApiError::invalid(message, Some("prompt")),
            // The request's schema allows nothing its other parameters let the model draw.
            Native::Core(Core::Constraint(_)) => ApiError::invalid(message, Some("response_format")),
            Native::Core(Core::ChatTemplate(_)) => ApiError::invalid(message, Some("messages")),
            Native::ShutDown
            | Native::EnginePanicked { .. }
            | Native::Core(Core::EngineStopped(_) | Core::Unhealthy(_)) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message,
                kind: "server_error",
                param: None,
                code: Some("engine_stopped"),
            },
            _ => ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message,
                kind: "server_error",
                param: None,
                code: None,
            },
        }
    }
}

impl From<flint_core::Error> for ApiError {
    fn from(error: flint_core::Error) -> Self {
        crate::Error::from(error).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}
