//! API-key authentication, before any routing: with keys configured, every path but the
//! open ones (the probes) needs `Authorization: Bearer <key>` (the scheme in any case,
//! as RFC 7235 has it) or, as Anthropic's clients send it, `x-api-key: <key>`, so
//! neither a wrong method nor an unknown path tells a client without a key which routes
//! exist. Keys are compared in constant time: the time
//! depends on the configured keys' lengths only, never on how much of a key the
//! presented one matches or on its length. Keys are never logged.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::api::error::ServerError;
use crate::serve::middleware::Front;
use crate::serve::routes::table as route_table;

/// Middleware: with keys configured, a request to a protected path needs a key.
pub async fn require_api_key(State(front): State<Front>, req: Request, next: Next) -> Response {
    if front.api_keys.is_empty() || route_table::is_open(req.uri().path()) {
        return next.run(req).await;
    }
    let headers = req.headers();
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .or_else(|| {
            headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        });
    match presented {
        Some(key) if key_matches(&front.api_keys, key) => next.run(req).await,
        _ => ServerError::Unauthorized.into_response(),
    }
}

/// The token of a `Bearer` credential; the scheme is case-insensitive.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares against every key without stopping at the first match.
fn key_matches(keys: &[String], presented: &str) -> bool {
    let mut found = subtle::Choice::from(0u8);
    for key in keys {
        found |= key_equals(key.as_bytes(), presented.as_bytes());
    }
    found.into()
}

/// `key == presented`, looking at every byte of `key` whatever `presented` is (subtle's
/// slice comparison returns early when the lengths differ).
fn key_equals(key: &[u8], presented: &[u8]) -> subtle::Choice {
    let mut equal = (key.len() as u64).ct_eq(&(presented.len() as u64));
    for (i, k) in key.iter().enumerate() {
        // Past the end of `presented`, compare with a byte that cannot match a key byte
        // being equal by accident: the length check already failed.
        let p = presented.get(i).copied().unwrap_or(0);
        equal &= k.ct_eq(&p);
    }
    equal
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, key_matches};

    #[test]
    fn matches_any_configured_key_exactly() {
        let keys = vec!["alpha".to_string(), "beta".to_string()];
        assert!(key_matches(&keys, "beta"));
        assert!(!key_matches(&keys, "bet"));
        assert!(!key_matches(&keys, "gamma"));
        assert!(!key_matches(&[], "alpha"));
        assert!(
            !key_matches(&keys, "alphabet"),
            "a longer key with the same prefix"
        );
        assert!(!key_matches(&keys, ""));
    }

    #[test]
    fn the_scheme_is_case_insensitive_and_nothing_else_is_a_bearer() {
        for ok in ["Bearer k", "bearer k", "BEARER k", "bEaReR   k "] {
            assert_eq!(bearer_token(ok), Some("k"), "{ok}");
        }
        for bad in ["Basic k", "Bearerk", "k", "Token k", ""] {
            assert_eq!(bearer_token(bad), None, "{bad}");
        }
    }
}
