//! `tessera serve` as an orchestrator runs it: the real binary and the default model,
//! probed while it starts, then sent SIGTERM while a stream is running. The stream
//! must finish normally, readiness must turn 503 during the drain, new work must be
//! refused, and the process must exit 0. Logs are JSON (`--log-format json`): every
//! line parses, the request's lines carry its id, and the prompt is not logged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

mod common;

/// Start `tessera serve` on a free port; its base URL once it listens, and its log
/// lines as they come.
fn start() -> (common::Server, String, common::Log) {
    let started = common::start_serve(
        &["--log-format", "json"],
        &["--max-model-len", "1024", "--shutdown-timeout", "60"],
        &[("RUST_LOG", "info")],
    );
    (started.server, started.base, started.log)
}

async fn probe(client: &reqwest::Client, base: &str, path: &str) -> (u16, Value) {
    let resp = client.get(format!("{base}{path}")).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_running_stream_finish_then_exits_zero() {
    let (mut server, base, logs) = start();
    let client = reqwest::Client::new();

    // Live at once; started and ready only after loading and warm-up.
    assert_eq!(probe(&client, &base, "/livez").await.0, 200);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, body) = probe(&client, &base, "/readyz").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        assert!(
            ["loading", "warming_up"].contains(&body["reason"].as_str().unwrap()),
            "{body}"
        );
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(probe(&client, &base, "/startupz").await.0, 200);
    let early_logs: Vec<String> = logs.try_iter().map(|(_, line)| line).collect();
    assert!(
        early_logs
            .iter()
            .any(|l| l.contains("warm-up: 4 tokens in")),
        "no warm-up line in {early_logs:?}"
    );

    // A stream long enough to outlive the signal.
    let resp = client
        .post(format!("{base}/v1/completions"))
        .header("x-request-id", "drain-test")
        .json(&json!({
            "model": "smollm2", "prompt": "Once upon a time", "max_tokens": 48,
            "temperature": 0, "ignore_eos": true, "stream": true
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "drain-test");
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    // Wait for generated text so the sequence is surely running.
    while !text.contains("\"text\"") {
        let chunk = body.next().await.expect("stream open").unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }

    let pid = server.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());

    // During the drain: not ready, still alive, new work refused.
    let mut saw_draining = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match client.get(format!("{base}/readyz")).send().await {
            Ok(r) if r.status() == 503 => {
                let b: Value = r.json().await.unwrap();
                assert_eq!(b["reason"], "draining", "{b}");
                saw_draining = true;
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(_) => break, // already gone: the stream must have ended first
        }
    }
    if saw_draining {
        let r = client
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": "smollm2", "prompt": "Hi", "max_tokens": 2}))
            .send()
            .await;
        if let Ok(r) = r {
            assert_eq!(r.status(), 503);
            let b: Value = r.json().await.unwrap();
            assert_eq!(b["error"]["code"], "shutting_down", "{b}");
        }
    }

    // The running stream ends normally: a finish reason, then [DONE], no error.
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(!text.contains("\"error\""), "{text}");

    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "did not exit after the drain");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    assert!(saw_draining, "/readyz never answered 503 during the drain");
    let mut log_text: Vec<String> = logs.try_iter().map(|(_, line)| line).collect();
    log_text.extend(early_logs);
    assert!(
        log_text.iter().any(|l| l.contains("shut down cleanly")),
        "{log_text:?}"
    );
    let lines: Vec<Value> = log_text
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let tagged = lines
        .iter()
        .find(|l| l["span"]["request_id"] == "drain-test")
        .expect("a log line with the request id");
    assert_eq!(tagged["fields"]["route"], "/v1/completions", "{tagged}");
    assert!(
        !log_text.iter().any(|l| l.contains("Once upon a time")),
        "the prompt was logged"
    );
}
