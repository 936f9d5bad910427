//! hyper answers some requests itself, before any route runs: a request head with more
//! headers than it parses (100) or larger than its read buffer gets a bare `431` with
//! no body. Clients of an OpenAI API expect the error envelope on every error, so the
//! connection's write side swaps that bare response for the same status with the
//! envelope (`headers_too_large`). Responses the application writes always have a
//! body, so they are never mistaken for it.

use crate::api::error::ServerError;

/// The enveloped response to write instead of `head`, when `head` is hyper's own bare
/// 431.
pub fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    if !head.starts_with(b"HTTP/1.1 431 ") || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?.to_ascii_lowercase();
    if !text.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let error = ServerError::HeadersRejected;
    let status = error.status();
    let body = serde_json::to_string(&error.body()).unwrap_or_else(|_| "{}".to_string());
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bare_431_is_replaced() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 08:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(bare).unwrap_or_default()).unwrap_or_default();
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(out.contains("\"code\":\"headers_too_large\""), "{out}");
        let ours = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 120\r\n\r\n";
        assert!(replacement(ours).is_none());
        let other = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(replacement(other).is_none());
    }
}
