//! Server-wide limits applied around every request: the size of the request headers
//! (431), the time to receive the body and the whole request's wall time (408), and the
//! bounds of a streamed response (its buffer of events and how long a client may leave
//! it full). The connection limit and the waits for request heads are the
//! connections' ([`crate::serve::connection`]).

use std::time::Duration;

use axum::http::HeaderMap;

/// Limits enforced by the HTTP layer. [`Default`] matches the flags' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Longest wall time of a whole request (streams included); `None`: no limit.
    pub request_timeout: Option<Duration>,
    /// Longest time from the request head to the last byte of its body; `None`: no
    /// limit beyond `request_timeout`.
    pub body_read_timeout: Option<Duration>,
    /// Largest total size of the request headers (names, values and separators).
    pub max_header_bytes: usize,
    /// Events a streamed response buffers for a client that reads slowly.
    pub stream_buffer_events: usize,
    /// How long a streamed response's buffer may stay full before the request is
    /// cancelled.
    pub stream_stall_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            request_timeout: Some(Duration::from_secs(600)),
            body_read_timeout: Some(Duration::from_secs(DEFAULT_BODY_READ_TIMEOUT_SECS)),
            max_header_bytes: 32 << 10,
            stream_buffer_events: 64,
            stream_stall_timeout: Duration::from_secs(30),
        }
    }
}

/// `--body-read-timeout` when none is given: a 4 MiB body at 140 KiB/s.
pub const DEFAULT_BODY_READ_TIMEOUT_SECS: u64 = 30;

/// Size of `headers` as sent: `name: value\r\n` for each.
pub fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn header_bytes_counts_names_values_and_separators() {
        let mut h = HeaderMap::new();
        h.insert("x-a", HeaderValue::from_static("12345"));
        h.append("x-a", HeaderValue::from_static("1"));
        assert_eq!(header_bytes(&h), (3 + 5 + 4) + (3 + 1 + 4));
    }
}
