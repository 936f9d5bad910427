//! `JsonBody`: the request body as JSON, with OpenAI-shaped errors for a wrong content
//! type (415), a body over the limit (413), a body that does not arrive within
//! `--body-read-timeout` (408) and malformed JSON (400).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use serde_json::Value;

use crate::api::error::ServerError;
use crate::serve::state::AppState;

#[derive(Debug)]
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ServerError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ServerError> {
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or("(not text)").to_string());
        let is_json = content_type.as_deref().is_some_and(|ct| {
            let mime = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            mime == "application/json" || mime.ends_with("+json")
        });
        if !is_json {
            return Err(ServerError::UnsupportedMediaType(
                content_type.unwrap_or_else(|| "no Content-Type".to_string()),
            ));
        }
        let read = Bytes::from_request(req, state);
        let read =
            match state.limits.body_read_timeout {
                Some(limit) => tokio::time::timeout(limit, read).await.map_err(|_| {
                    ServerError::BodyTimeout {
                        limit_secs: limit.as_secs(),
                    }
                })?,
                None => read.await,
            };
        let bytes = read.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ServerError::PayloadTooLarge {
                    limit_bytes: state.max_body_bytes,
                }
            } else {
                ServerError::InvalidJson(format!("cannot read the body: {}", r.body_text()))
            }
        })?;
        parse_json_body(&bytes).map(JsonBody)
    }
}

/// The body bytes as JSON; malformed JSON is a 400 naming the fault.
pub fn parse_json_body(bytes: &[u8]) -> Result<Value, ServerError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ServerError::InvalidJson(format!("the body is not valid JSON: {e}")))
}
