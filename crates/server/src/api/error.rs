//! `ServerError`: every way a request can fail, and the OpenAI error envelope of each.
//! `serve::error` maps them to HTTP statuses and responses.
//!
//! Internal details (engine messages, I/O errors) are logged there and never sent: a 500
//! or 503 body carries a generic message only.

use tessera_scheduler::AdmissionError;

use crate::api::error_body::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A parameter is missing, malformed, out of range or not supported (400).
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    /// The body is not JSON or not an object (400).
    #[error("{0}")]
    InvalidJson(String),
    /// Keys are configured and the request has none or a wrong one (401).
    #[error("missing or incorrect API key")]
    Unauthorized,
    /// The `model` field is not a name of the served model (404); `served` lists them.
    #[error("the model `{requested}` does not exist; this server serves {served}")]
    ModelNotFound { requested: String, served: String },
    /// No route has this path (404).
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    /// The route exists but not for this method (405).
    #[error("method {method} is not allowed for {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The body is larger than `--max-body-bytes` (413).
    #[error("request body is larger than the limit of {limit_bytes} bytes")]
    PayloadTooLarge { limit_bytes: usize },
    /// The request headers are larger than `--max-header-bytes` (431).
    #[error("request headers are {size_bytes} bytes, more than the limit of {limit_bytes} bytes")]
    HeadersTooLarge {
        size_bytes: usize,
        limit_bytes: usize,
    },
    /// The HTTP parser refused the request head: more headers than it parses, or a head
    /// larger than its buffer (431).
    #[error("the request headers are too many (at most 100) or too large for the server to parse")]
    HeadersRejected,
    /// hyper could not parse the request as HTTP (400).
    #[error("the request is not valid HTTP")]
    MalformedRequest,
    /// The request URI is longer than the HTTP parser takes (414).
    #[error("the request URI is too long")]
    UriTooLong,
    /// The request head did not arrive within `--header-read-timeout` (408).
    #[error("the request head did not arrive within {limit_secs} seconds")]
    HeadTimeout { limit_secs: u64 },
    /// The request body did not arrive within `--body-read-timeout` (408).
    #[error("the request body did not arrive within {limit_secs} seconds")]
    BodyTimeout { limit_secs: u64 },
    /// The request ran longer than `--request-timeout`; it was cancelled (408).
    #[error("the request took longer than the limit of {limit_secs} seconds and was cancelled")]
    RequestTimeout { limit_secs: u64 },
    /// Every grammar compile slot stayed busy for the whole compile time limit (503).
    #[error("the server is busy compiling other structured output formats; retry shortly")]
    CompilerBusy,
    /// Every connection slot is taken (`--max-connections`) (503).
    #[error("the server has too many open connections; retry shortly")]
    TooManyConnections,
    /// The body is not `application/json` (415).
    #[error("expected a body with Content-Type: application/json, got {0}")]
    UnsupportedMediaType(String),
    /// The scheduler refused the request at the door (429, 400 or 503).
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The server is loading or warming up the model (503).
    #[error("the model is still loading; retry shortly")]
    Starting,
    /// The engine failed while running this request (503). The string is logged only.
    #[error("the engine failed")]
    EngineFailed(String),
    /// The engine could not finish this request (its step failed, or its own input
    /// was refused there) and goes on serving others (500). The string is logged only.
    #[error("generation failed")]
    GenerationFailed(String),
    /// The engine has failed and the process is about to exit for a restart; new
    /// requests are refused (503).
    #[error("the engine failed and the server is restarting; retry later")]
    EngineDown,
    /// A bug or I/O failure (500). The string is logged only.
    #[error("internal error")]
    Internal(String),
}

impl ServerError {
    /// The parameter a 400 names, if it names one.
    pub fn param(&self) -> Option<&str> {
        match self {
            ServerError::InvalidRequest { param, .. } => param.as_deref(),
            _ => None,
        }
    }

    /// A 400 that names the offending parameter.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ServerError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// The OpenAI error envelope for this error (also sent as an SSE event mid-stream);
    /// internal failures name `request_id` (for the logs) and nothing else.
    pub fn envelope(&self, request_id: Option<&str>) -> ErrorBody {
        let (kind, code) = match self {
            ServerError::InvalidRequest { .. } | ServerError::InvalidJson(_) => {
                ("invalid_request_error", None)
            }
            ServerError::Unauthorized => ("authentication_error", Some("invalid_api_key")),
            ServerError::ModelNotFound { .. } => ("invalid_request_error", Some("model_not_found")),
            ServerError::RouteNotFound { .. } => ("invalid_request_error", Some("not_found")),
            ServerError::MethodNotAllowed { .. } => {
                ("invalid_request_error", Some("method_not_allowed"))
            }
            ServerError::PayloadTooLarge { .. } => {
                ("invalid_request_error", Some("payload_too_large"))
            }
            ServerError::UnsupportedMediaType(_) => {
                ("invalid_request_error", Some("unsupported_media_type"))
            }
            ServerError::HeadersTooLarge { .. } | ServerError::HeadersRejected => {
                ("invalid_request_error", Some("headers_too_large"))
            }
            ServerError::RequestTimeout { .. } => ("timeout_error", Some("request_timeout")),
            ServerError::HeadTimeout { .. } => ("timeout_error", Some("header_read_timeout")),
            ServerError::BodyTimeout { .. } => ("timeout_error", Some("body_read_timeout")),
            ServerError::MalformedRequest => ("invalid_request_error", Some("malformed_request")),
            ServerError::UriTooLong => ("invalid_request_error", Some("uri_too_long")),
            ServerError::TooManyConnections => ("server_error", Some("too_many_connections")),
            ServerError::CompilerBusy => ("server_error", Some("server_busy")),
            ServerError::Admission(a) => match a {
                AdmissionError::QueueFull { .. } => ("rate_limit_error", Some("queue_full")),
                AdmissionError::NeverFits { .. } => {
                    ("invalid_request_error", Some("context_length_exceeded"))
                }
                AdmissionError::Invalid(_) => ("invalid_request_error", None),
                AdmissionError::ShuttingDown => ("server_error", Some("shutting_down")),
            },
            ServerError::EngineFailed(_) | ServerError::EngineDown => {
                ("server_error", Some("engine_failed"))
            }
            ServerError::Starting => ("server_error", Some("model_loading")),
            ServerError::GenerationFailed(_) => ("server_error", Some("generation_failed")),
            ServerError::Internal(_) => ("server_error", None),
        };
        let param = match self {
            ServerError::InvalidRequest { param, .. } => param.clone(),
            ServerError::ModelNotFound { .. } => Some("model".to_string()),
            ServerError::Admission(AdmissionError::NeverFits { .. }) => {
                Some("max_tokens".to_string())
            }
            _ => None,
        };
        let request = request_id
            .map(|id| format!(" (request id {id})"))
            .unwrap_or_default();
        let message = match self {
            ServerError::EngineFailed(_) => {
                format!("the engine failed while running this request{request}; retry later")
            }
            ServerError::GenerationFailed(_) => format!(
                "the engine could not finish this request{request}; other requests are \
                 unaffected, so it may be retried"
            ),
            ServerError::Internal(_) => format!("internal server error{request}"),
            // The client can shorten the request; the operator can raise the limits, and
            // should be told which flags do.
            ServerError::Admission(never @ AdmissionError::NeverFits { .. }) => format!(
                "{never}; a shorter prompt or a smaller max_tokens fits, or the server can \
                 be started with a larger --max-model-len or --kv-cache-memory-mib"
            ),
            other => other.to_string(),
        };
        ErrorBody::new(message, kind, param, code.map(str::to_string))
    }
}

impl From<tessera_tokenizer::TokenizerError> for ServerError {
    fn from(e: tessera_tokenizer::TokenizerError) -> Self {
        match e {
            // The client's text, not the server, is at fault.
            tessera_tokenizer::TokenizerError::Unrepresentable { .. } => {
                ServerError::invalid("prompt", e.to_string())
            }
            tessera_tokenizer::TokenizerError::NoFimTokens => {
                ServerError::invalid("suffix", e.to_string())
            }
            other => ServerError::Internal(format!("tokenizer: {other}")),
        }
    }
}
