//! Tools of the adversarial tests: raw sockets that send what a real client would not,
//! the server's own metrics, and its memory as the kernel counts it.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `host:port` of a base URL.
pub fn addr(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

/// A raw connection that has sent `bytes`.
pub async fn send_raw(base: &str, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr(base)).await.unwrap();
    s.write_all(bytes).await.unwrap();
    s
}

/// Everything the server sends until it closes the connection or `within` passes; and
/// whether it closed.
pub async fn read_until_closed(s: &mut TcpStream, within: Duration) -> (String, bool) {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into(), false),
        }
    }
}

/// The status code and the JSON body of a raw HTTP/1.1 response.
pub fn parse_response(raw: &str) -> (u16, serde_json::Value) {
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// One sample of the server's `/metrics` (the first line of `name` with `labels` in it).
pub async fn metric(client: &reqwest::Client, base: &str, name: &str, labels: &str) -> f64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.split(['{', ' ']).next() == Some(name) && (labels.is_empty() || l.contains(labels))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Waits until `check` holds, for at most `within`; whether it did.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A field of `/proc/PID/status` in MiB (`VmRSS`, `VmHWM`).
pub fn memory_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Whether the server still serves: `/readyz` answers 200.
pub async fn still_serving(client: &reqwest::Client, base: &str) -> bool {
    matches!(
        client.get(format!("{base}/readyz")).send().await,
        Ok(r) if r.status() == 200
    )
}
