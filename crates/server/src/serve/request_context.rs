//! Per-request context: a request id (the client's `X-Request-Id` when it is sane,
//! otherwise a new one) returned in the response header and carried by a tracing span
//! so every log line of the request names it; and the HTTP request counter.
//!
//! It also enforces the per-request limits of [`ServerLimits`]: headers over
//! `--max-header-bytes` get a 431, and a request running past `--request-timeout` is
//! dropped (which cancels its sequences) and answered with a 408. The request id and
//! deadline are visible to the handlers' code as [`current_request`].
//!
//! Prompt text is never logged here: the completion line has method, route, status and
//! latency only.

use std::future::Future;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::api::error::ServerError;
use crate::serve::limits::{header_bytes, ServerLimits};
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

/// The request being served: its id and when its time is up.
#[derive(Debug, Clone)]
pub struct RequestScope {
    pub id: String,
    pub deadline: Option<Instant>,
}

tokio::task_local! {
    static SCOPE: RequestScope;
}

/// The request this task serves, if any.
pub fn current_request() -> Option<RequestScope> {
    SCOPE.try_with(Clone::clone).ok()
}

/// The id of the request this task serves, if any.
pub fn current_request_id() -> Option<String> {
    SCOPE.try_with(|s| s.id.clone()).ok()
}

/// Run `work` (a task spawned for a request) as part of `scope`.
pub async fn within<F: Future>(scope: Option<RequestScope>, work: F) -> F::Output {
    match scope {
        Some(scope) => SCOPE.scope(scope, work).await,
        None => work.await,
    }
}

/// The header and wall-time limits around the handler.
async fn limited(limits: ServerLimits, req: Request, next: Next) -> Response {
    let size = header_bytes(req.headers());
    if size > limits.max_header_bytes {
        return ServerError::HeadersTooLarge {
            size_bytes: size,
            limit_bytes: limits.max_header_bytes,
        }
        .into_response();
    }
    let Some(limit) = limits.request_timeout else {
        return next.run(req).await;
    };
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(response) => response,
        // Dropping the handler's future dropped its sequences' receivers: cancelled.
        Err(_) => ServerError::RequestTimeout {
            limit_secs: limit.as_secs(),
        }
        .into_response(),
    }
}

/// Middleware around every route (and the 404/405 fallbacks).
pub async fn request_context(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&req);
    let route = route_template(req.uri().path());
    let method = req.method().clone();
    let span = tracing::info_span!("request", request_id = %id);
    let scope = RequestScope {
        id: id.clone(),
        deadline: app.limits.request_timeout.map(|t| started + t),
    };
    let mut response = SCOPE
        .scope(scope, limited(app.limits, req, next))
        .instrument(span.clone())
        .await;
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
