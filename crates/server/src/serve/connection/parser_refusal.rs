//! hyper answers some requests itself, before any route runs: a request it cannot parse
//! gets a bare `400`, a URI over its limit a bare `414`, and a head with more headers
//! than it parses (100) or larger than its read buffer a bare `431`, all with no body.
//! Clients of an OpenAI API expect the error envelope on every error, so the
//! connection's write side swaps such a bare response for the same status with the
//! envelope. Responses the application writes always have a body, so they are never
//! mistaken for one.

use crate::api::error::ServerError;

/// Makes the error a bare response stands for.
type Refusal = fn() -> ServerError;

/// The statuses hyper writes itself, and the error each stands for.
const BARE: [(&[u8], Refusal); 3] = [
    (b"HTTP/1.1 400 ", || ServerError::MalformedRequest),
    (b"HTTP/1.1 414 ", || ServerError::UriTooLong),
    (b"HTTP/1.1 431 ", || ServerError::HeadersRejected),
];

/// Whether `first` (the first bytes of a write) may start a bare response.
pub fn may_be_bare(first: &[u8]) -> bool {
    BARE.iter().any(|(status, _)| first.starts_with(status))
}

/// The enveloped response to write instead of `head`, when `head` is one of hyper's bare
/// responses.
pub fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let (_, error) = BARE.iter().find(|(status, _)| head.starts_with(status))?;
    if !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?.to_ascii_lowercase();
    if !text.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    Some(enveloped_close(&error()))
}

/// A whole HTTP/1.1 response for `error` in the envelope, closing the connection.
pub fn enveloped_close(error: &ServerError) -> Vec<u8> {
    let status = error.status();
    let body = serde_json::to_string(&error.body()).unwrap_or_else(|_| "{}".to_string());
    let retry = match status.as_u16() {
        503 => "retry-after: 1\r\n",
        _ => "",
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replaced(head: &[u8]) -> String {
        String::from_utf8(replacement(head).unwrap_or_default()).unwrap_or_default()
    }

    #[test]
    fn only_hypers_bare_responses_are_replaced() {
        for (status, code) in [
            ("431 Request Header Fields Too Large", "headers_too_large"),
            ("400 Bad Request", "malformed_request"),
            ("414 URI Too Long", "uri_too_long"),
        ] {
            let bare = format!(
                "HTTP/1.1 {status}\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 08:00:00 GMT\r\n\r\n"
            );
            let out = replaced(bare.as_bytes());
            assert!(
                out.starts_with(&format!("HTTP/1.1 {}", &status[..4])),
                "{out}"
            );
            assert!(out.contains(&format!("\"code\":\"{code}\"")), "{out}");
            assert!(out.contains("connection: close"), "{out}");
        }
        let ours = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 120\r\n\r\n";
        assert!(replacement(ours).is_none());
        let other = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(replacement(other).is_none());
        assert!(!may_be_bare(b"HTTP/1.1 200 OK"));
    }
}
