//! The HTTP side of [`ServerError`]: the status of each error, its logging, and the
//! response with the OpenAI error envelope.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tessera_scheduler::AdmissionError;

use crate::api::error::ServerError;
use crate::api::error_body::ErrorBody;
use crate::serve::middleware::envelope::ErrorMessage;
use crate::serve::middleware::request_context::current_request_id;

/// Seconds a client is told to wait after a 429 or 503.
const RETRY_AFTER_SECS: &str = "1";

impl ServerError {
    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ServerError::InvalidRequest { .. } | ServerError::InvalidJson(_) => {
                StatusCode::BAD_REQUEST
            }
            ServerError::Unauthorized => StatusCode::UNAUTHORIZED,
            ServerError::ModelNotFound { .. } | ServerError::RouteNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            ServerError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ServerError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ServerError::HeadersTooLarge { .. } | ServerError::HeadersRejected => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            ServerError::RequestTimeout { .. }
            | ServerError::HeadTimeout { .. }
            | ServerError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ServerError::MalformedRequest => StatusCode::BAD_REQUEST,
            ServerError::UriTooLong => StatusCode::URI_TOO_LONG,
            ServerError::TooManyConnections | ServerError::CompilerBusy => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ServerError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ServerError::Admission(a) => match a {
                AdmissionError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
                AdmissionError::NeverFits { .. } | AdmissionError::Invalid(_) => {
                    StatusCode::BAD_REQUEST
                }
                AdmissionError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            },
            ServerError::EngineFailed(_) | ServerError::EngineDown | ServerError::Starting => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ServerError::Internal(_) | ServerError::GenerationFailed(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The OpenAI error envelope for this error, naming the current request's id.
    pub fn body(&self) -> ErrorBody {
        self.envelope(current_request_id().as_deref())
    }

    /// Log what the client will not see.
    pub fn log(&self) {
        match self {
            ServerError::EngineFailed(detail) => tracing::error!("engine failure: {detail}"),
            ServerError::GenerationFailed(detail) => {
                tracing::error!("generation failed: {detail}")
            }
            ServerError::Internal(detail) => tracing::error!("internal error: {detail}"),
            other => tracing::debug!("request refused ({}): {other}", other.status()),
        }
    }
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        self.log();
        let status = self.status();
        let body = self.body();
        let message = ErrorMessage(body.error.message.clone());
        let mut response = (status, axum::Json(body)).into_response();
        // Routes of other APIs re-envelope the error from it (Anthropic's Messages API).
        response.extensions_mut().insert(message);
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        if status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
