//! Bearer-token authentication. Keys are compared in constant time (for keys of the
//! same length) and never logged.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::serve::error::ServerError;
use crate::serve::state::AppState;

/// Middleware: with keys configured, a request needs `Authorization: Bearer <key>`.
pub async fn require_api_key(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if app.api_keys.is_empty() {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(key) if key_matches(&app.api_keys, key) => next.run(req).await,
        _ => ServerError::Unauthorized.into_response(),
    }
}

/// Compares against every key without stopping at the first match.
fn key_matches(keys: &[String], presented: &str) -> bool {
    let mut found = subtle::Choice::from(0u8);
    for key in keys {
        found |= key.as_bytes().ct_eq(presented.as_bytes());
    }
    found.into()
}

#[cfg(test)]
mod tests {
    use super::key_matches;

    #[test]
    fn matches_any_configured_key_exactly() {
        let keys = vec!["alpha".to_string(), "beta".to_string()];
        assert!(key_matches(&keys, "beta"));
        assert!(!key_matches(&keys, "bet"));
        assert!(!key_matches(&keys, "gamma"));
        assert!(!key_matches(&[], "alpha"));
    }
}
