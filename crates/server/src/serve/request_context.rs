//! Per-request context: a request id (the client's `X-Request-Id` when it is sane,
//! otherwise a new one) returned in the response header and carried by a tracing span
//! so every log line of the request names it; and the HTTP request counter.
//!
//! Prompt text is never logged here: the completion line has method, route, status and
//! latency only.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::serve::router::route_template;
use crate::serve::state::{random_id, AppState};

pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-chosen request id accepted; longer ones are replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The request's id: the client's if printable ASCII of reasonable length.
fn request_id(req: &Request) -> String {
    req.headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= MAX_REQUEST_ID_LEN
                && v.bytes().all(|b| b.is_ascii_graphic())
        })
        .map(str::to_string)
        .unwrap_or_else(random_id)
}

/// Middleware around every route (and the 404/405 fallbacks).
pub async fn request_context(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&req);
    let route = route_template(req.uri().path());
    let method = req.method().clone();
    let span = tracing::info_span!("request", request_id = %id);
    let mut response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    app.metrics.count_http(route, status);
    let latency_ms = started.elapsed().as_millis() as u64;
    // Probes and scrapes come every few seconds: keep them out of info logs.
    let quiet = matches!(
        route,
        "/livez" | "/readyz" | "/startupz" | "/health" | "/metrics"
    );
    span.in_scope(|| {
        if quiet {
            tracing::debug!(%method, route, status, latency_ms, "response started");
        } else {
            tracing::info!(%method, route, status, latency_ms, "response started");
        }
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID.clone(), value);
    }
    response
}
