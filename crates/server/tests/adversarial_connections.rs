//! Hostile connections against the real `tessera serve`: silent sockets, heads and
//! bodies that trickle in or never finish, idle keep-alives, bodies larger than allowed,
//! bytes that are not HTTP, requests without a key, and more connections than the
//! open-file limit allows. Every refusal is an OpenAI error envelope, and the server
//! keeps serving real clients throughout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::hostile::*;
use serde_json::{json, Value};

const MODEL: &str = "smollm2";

/// `tessera serve` with `extra` flags; the handle keeps its log pipe open.
fn start(extra: &[&str]) -> (common::Started, String) {
    let mut args = vec![
        "serve",
        "--port",
        "0",
        "--served-model-name",
        MODEL,
        "--threads-per-rank",
        "1",
        "--kv-cache-memory-mib",
        "32",
    ];
    args.extend_from_slice(extra);
    let started = common::start(&args, &[("RUST_LOG", "info")]);
    let base = started.base.clone();
    (started, base)
}

async fn ready(base: &str) -> reqwest::Client {
    let client = reqwest::Client::new();
    common::wait_ready(&client, base, Duration::from_secs(120)).await;
    client
}

/// A client that opens a new connection for each request.
fn fresh() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A request whose head is whole but whose body (of `len` bytes) has only begun.
fn partial_body(len: usize) -> Vec<u8> {
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n{{\"model\""
    )
    .into_bytes()
}

fn assert_envelope(status: u16, body: &Value, want: u16, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_cannot_lock_clients_out() {
    let (_server, base) = start(&["--max-connections", "8", "--header-read-timeout", "600"]);
    ready(&base).await;
    // Every slot taken by a socket that sends nothing (no timeout would free them soon).
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(send_raw(&base, b"").await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Probes and requests still get through, each in the place of a silent socket.
    for _ in 0..3 {
        let r = fresh().get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let (status, reply) = common::post_json(
            &fresh(),
            &format!("{base}/v1/completions"),
            &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
        )
        .await;
        assert_eq!(status, 200, "{reply}");
    }
    // The longest-waiting silent sockets were the ones closed.
    let (_, closed) = read_until_closed(&mut silent[0], Duration::from_secs(5)).await;
    assert!(closed, "the oldest silent socket is still open");
    let (_, closed) = read_until_closed(&mut silent[7], Duration::from_millis(200)).await;
    assert!(!closed, "the newest silent socket was closed first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_serving_requests_keep_their_slots_and_extra_ones_get_503() {
    let (_server, base) = start(&["--max-connections", "2", "--body-read-timeout", "600"]);
    let client = ready(&base).await;
    drop(client);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Two requests in progress (their bodies still coming) hold both slots.
    let a = send_raw(&base, &partial_body(100)).await;
    let b = send_raw(&base, &partial_body(100)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = fresh()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = r.json().await.unwrap();
    assert_envelope(status, &body, 503, "too_many_connections");
    // Their slots free up when they go.
    drop((a, b));
    assert!(
        eventually(Duration::from_secs(5), || async {
            matches!(fresh().get(format!("{base}/v1/models")).send().await, Ok(r) if r.status() == 200)
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_bodies_and_idle_connections_are_timed() {
    let (_server, base) = start(&[
        "--header-read-timeout",
        "2",
        "--keep-alive-timeout",
        "2",
        "--body-read-timeout",
        "2",
    ]);
    ready(&base).await;
    // A head that never finishes: 408 in the envelope, then closed.
    let started = Instant::now();
    let mut s = send_raw(&base, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n").await;
    let (raw, closed) = read_until_closed(&mut s, Duration::from_secs(15)).await;
    assert!(closed);
    let (status, body) = parse_response(&raw);
    assert_envelope(status, &body, 408, "header_read_timeout");
    assert!(started.elapsed() >= Duration::from_secs(2));
    // A socket that sends nothing: closed without a word.
    let mut s = send_raw(&base, b"").await;
    let (raw, closed) = read_until_closed(&mut s, Duration::from_secs(15)).await;
    assert!(closed && raw.is_empty(), "{raw}");
    // A kept-alive connection that sends no second request: closed.
    let mut s = send_raw(&base, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let (raw, closed) = read_until_closed(&mut s, Duration::from_secs(15)).await;
    assert!(closed && raw.starts_with("HTTP/1.1 200"), "{raw}");
    // A body that never completes: 408, within the body timeout, not the request's.
    let started = Instant::now();
    let mut s = send_raw(&base, &partial_body(500)).await;
    let (raw, _) = read_until_closed(&mut s, Duration::from_secs(15)).await;
    let (status, body) = parse_response(&raw);
    assert_envelope(status, &body, 408, "body_read_timeout");
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_refused_before_it_is_sent() {
    let (_server, base) = start(&["--max-body-bytes", "1000"]);
    ready(&base).await;
    let started = Instant::now();
    let mut s = send_raw(
        &base,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n",
    )
    .await;
    let (raw, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
    let (status, body) = parse_response(&raw);
    assert_envelope(status, &body, 413, "payload_too_large");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_an_envelope_and_the_key_comes_first() {
    let (_server, base) = start(&["--api-key", "sekret"]);
    let client = ready(&base).await;
    // Bytes that are not HTTP, and a URI past the parser's limit.
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(200_000));
    for (bytes, want, code) in [
        (b"GARBAGE\r\n\r\n".to_vec(), 400, "malformed_request"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (long_uri.into_bytes(), 414, "uri_too_long"),
    ] {
        let mut s = send_raw(&base, &bytes).await;
        let (raw, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        let (status, body) = parse_response(&raw);
        assert_envelope(status, &body, want, code);
    }
    // Without a key, nothing tells which routes exist: a wrong method or an unknown
    // path is 401 like the rest.
    for (method, path) in [
        (reqwest::Method::POST, "/v1/models"),
        (reqwest::Method::GET, "/v1/chat/completions"),
        (reqwest::Method::DELETE, "/v1/responses"),
        (reqwest::Method::GET, "/no/such/route"),
    ] {
        let r = client
            .request(method.clone(), format!("{base}{path}"))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        assert_envelope(status, &body, 401, "invalid_api_key");
    }
    // The scheme is case-insensitive.
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let r = client
            .get(format!("{base}/v1/models"))
            .header("authorization", format!("{scheme} sekret"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    // Probes need no key, carry a request id, are counted, and a wrong method on one is
    // a 405 in the envelope.
    let r = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-request-id").is_some());
    let r = client.post(format!("{base}/health")).send().await.unwrap();
    let status = r.status().as_u16();
    assert!(r.headers().get("x-request-id").is_some());
    let body: Value = r.json().await.unwrap();
    assert_envelope(status, &body, 405, "method_not_allowed");
    // A Responses request is counted under its own route.
    let r = client
        .post(format!("{base}/v1/responses"))
        .header("authorization", "Bearer sekret")
        .json(&json!({"model": MODEL, "input": "Hi", "max_output_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let metrics = client
        .get(format!("{base}/metrics"))
        .header("authorization", "Bearer sekret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = |route: &str, status: &str| {
        metrics.lines().any(|l| {
            l.starts_with("tessera_http_requests_total")
                && l.contains(&format!("route=\"{route}\""))
                && l.contains(&format!("status=\"{status}\""))
        })
    };
    assert!(counted("/readyz", "200"), "{metrics}");
    assert!(counted("/health", "405"), "{metrics}");
    assert!(counted("/v1/responses", "200"), "{metrics}");
}

/// `tessera serve` with its open-file limit (soft and hard) set to `files`.
fn start_with_file_limit(files: u64, extra: &[&str]) -> (common::Started, String) {
    use std::os::unix::process::CommandExt;
    let mut args = vec![
        "serve",
        "--port",
        "0",
        "--served-model-name",
        MODEL,
        "--threads-per-rank",
        "1",
    ];
    args.extend_from_slice(extra);
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
    command.args(&args).env("RUST_LOG", "info");
    // SAFETY: only async-signal-safe `setrlimit` runs between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: files,
                rlim_max: files,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = common::start_command(command);
    let base = started.base.clone();
    (started, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_connections_than_open_files_are_refused_not_left_hanging() {
    // 400 files: connections are capped well below --max-connections' 1024.
    let (server, base) = start_with_file_limit(400, &["--body-read-timeout", "600"]);
    ready(&base).await;
    let early = server.early.join("\n");
    let log = &server.log;
    let mut held = Vec::new();
    let mut refused = 0;
    // Connections that each hold a request in progress, far past the cap.
    for _ in 0..200 {
        let mut s = send_raw(&base, &partial_body(100)).await;
        let (raw, _) = read_until_closed(&mut s, Duration::from_millis(30)).await;
        if raw.is_empty() {
            held.push(s);
            continue;
        }
        let (status, body) = parse_response(&raw);
        assert_envelope(status, &body, 503, "too_many_connections");
        refused += 1;
    }
    assert!(
        refused > 0 && held.len() < 200,
        "held {}, refused {refused}",
        held.len()
    );
    // Once they go, a client is served.
    drop(held);
    assert!(
        eventually(Duration::from_secs(5), || async {
            matches!(fresh().get(format!("{base}/v1/models")).send().await, Ok(r) if r.status() == 200)
        })
        .await
    );
    let later: Vec<String> = log.try_iter().map(|(_, l)| l).collect();
    let all = format!("{early}\n{}", later.join("\n"));
    let capped = all.matches("does not fit the open-file limit").count();
    assert_eq!(capped, 1, "{all}");
    assert!(
        all.matches("accepting connections failed").count() <= 1,
        "{all}"
    );
}
