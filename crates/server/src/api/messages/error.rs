//! Errors on the Messages routes, in Anthropic's envelope and with its status codes:
//! `{"type": "error", "error": {"type", "message"}}`. The server's errors keep their
//! status, except that an overloaded server answers 529 where the OpenAI routes send
//! 503.

use serde_json::{json, Value};

/// Anthropic's status and envelope for an error the server answered `status` with.
pub fn anthropic_error(status: u16, message: &str) -> (u16, Value) {
    let (status, kind) = match status {
        400 => (400, "invalid_request_error"),
        401 => (401, "authentication_error"),
        403 => (403, "permission_error"),
        404 => (404, "not_found_error"),
        413 => (413, "request_too_large"),
        429 => (429, "rate_limit_error"),
        503 | 529 => (529, "overloaded_error"),
        s if (400..500).contains(&s) => (s, "invalid_request_error"),
        s => (s, "api_error"),
    };
    (
        status,
        json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_anthropics_type_and_overload_is_529() {
        for (status, want_status, kind) in [
            (400, 400, "invalid_request_error"),
            (401, 401, "authentication_error"),
            (404, 404, "not_found_error"),
            (413, 413, "request_too_large"),
            (429, 429, "rate_limit_error"),
            (500, 500, "api_error"),
            (503, 529, "overloaded_error"),
            (408, 408, "invalid_request_error"),
        ] {
            let (s, body) = anthropic_error(status, "why");
            assert_eq!(s, want_status);
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], kind);
            assert_eq!(body["error"]["message"], "why");
        }
    }
}
