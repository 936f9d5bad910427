//! Errors of the Messages API's routes in Anthropic's envelope. Every error leaves the
//! server as a `ServerError` response in the OpenAI envelope, with its message kept
//! beside it; on Anthropic's routes this layer rewraps it (`{"type": "error", "error":
//! {...}}`, Anthropic's statuses: 529 for an overloaded server), whether the route, the
//! body reader or a layer in front of them (authentication, limits) refused the request.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::messages::error::anthropic_error;

/// The message of an error response, kept beside its OpenAI envelope for routes whose
/// API wraps errors otherwise.
#[derive(Debug, Clone)]
pub struct ErrorMessage(pub String);

/// `response` in Anthropic's envelope, when it is an error response of the server's.
pub fn anthropic(response: Response) -> Response {
    let Some(ErrorMessage(message)) = response.extensions().get::<ErrorMessage>().cloned() else {
        return response;
    };
    let (parts, _) = response.into_parts();
    let (status, body) = anthropic_error(parts.status.as_u16(), &message);
    let status = StatusCode::from_u16(status).unwrap_or(parts.status);
    let mut out = (status, axum::Json(body)).into_response();
    // The error's own headers (`Allow`, `Retry-After`, `Connection`, the request id)
    // stay; only the body's change.
    for (name, v) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().append(name.clone(), v.clone());
        }
    }
    if status.as_u16() == 529 && !out.headers().contains_key(header::RETRY_AFTER) {
        out.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    out
}
