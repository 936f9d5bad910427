//! Per-request context: a request id (the client's `X-Request-Id` when it is sane,
//! otherwise a new one) returned in the response header and carried by a tracing span
//! so every log line of the request names it; and the HTTP request counter.
//!
//! It also enforces the per-request limits of [`ServerLimits`]: headers over
//! `--max-header-bytes` get a 431, a `Content-Length` over `--max-body-bytes` a 413
//! before any of the body is read, and a request running past `--request-timeout` is
//! dropped (which cancels its sequences) and answered with a 408. The request id and
//! deadline are visible to the handlers' code as [`current_request`].
//!
//! The request's connection counts it as in progress until its response has been
//! written (or abandoned): only then does the connection's keep-alive wait start, and
//! only a connection with no request in progress can be evicted.
//!
//! Prompt text is never logged here: the completion line has method, route, status and
//! latency only.

use std::future::Future;
use std::time::Instant;

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::api::error::ServerError;
use crate::serve::connection::{ConnHandle, RequestGuard};
use crate::serve::limits::{header_bytes, ServerLimits};
use crate::serve::middleware::Front;
use crate::serve::routes::table as route_table;
use crate::serve::state::random_id;

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

/// The header, body-size and wall-time limits around the handler.
async fn limited(
    limits: ServerLimits,
    max_body_bytes: usize,
    req: Request,
    next: Next,
) -> Response {
    let size = header_bytes(req.headers());
    if size > limits.max_header_bytes {
        return ServerError::HeadersTooLarge {
            size_bytes: size,
            limit_bytes: limits.max_header_bytes,
        }
        .into_response();
    }
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > max_body_bytes as u64) {
        // Refused before any of the body is read; the connection closes.
        let mut response = ServerError::PayloadTooLarge {
            limit_bytes: max_body_bytes,
        }
        .into_response();
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            HeaderValue::from_static("close"),
        );
        return response;
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
pub async fn request_context(State(front): State<Front>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    // Until the response is written, the connection has a request in progress.
    let in_progress = req
        .extensions()
        .get::<ConnectInfo<ConnHandle>>()
        .map(|ConnectInfo(conn)| conn.0.request_started());
    let id = request_id(&req);
    let route = route_table::template(req.uri().path());
    let anthropic = route_table::is_messages(req.uri().path());
    let method = req.method().clone();
    let span = tracing::info_span!("request", request_id = %id);
    let scope = RequestScope {
        id: id.clone(),
        deadline: front.limits.request_timeout.map(|t| started + t),
    };
    let large_body = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|len| len >= RETURN_MEMORY_AFTER_BYTES);
    let response = SCOPE
        .scope(
            scope,
            limited(front.limits, front.max_body_bytes, req, next),
        )
        .instrument(span.clone())
        .await;
    if large_body {
        return_freed_memory();
    }
    let response = match anthropic {
        true => crate::serve::middleware::envelope::anthropic(response),
        false => response,
    };
    let mut response = match in_progress {
        Some(guard) => response.map(|body| {
            Body::new(Guarded {
                body,
                _guard: guard,
            })
        }),
        None => response,
    };
    let status = response.status().as_u16();
    front.metrics.count_http(route, status);
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

/// Bodies from this size on are parsed into many small allocations (a JSON document,
/// its messages, the rendered prompt); once handled, what they freed is given back to
/// the system.
const RETURN_MEMORY_AFTER_BYTES: u64 = 1 << 20;

/// Gives memory the allocator holds free back to the system: glibc keeps what a burst of
/// large requests freed in its arenas otherwise, and the process stays at its peak.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A response body that keeps its request counted as in progress on its connection
/// until the body is done (written, or dropped with the connection).
struct Guarded {
    body: Body,
    _guard: RequestGuard,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
