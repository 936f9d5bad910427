//! A device rank failing under load, end to end: the real binary (built with the
//! `fault-injection` feature) with `--tensor-parallel-size 2` on the default model and
//! `--inject-fault 1:KIND:AFTER_STEPS`. While streaming and non-streaming requests run,
//! rank 1 fails. Failures stay as small as their cause:
//!
//! - KIND error and panic spoil one step: the requests in that step end with the
//!   `generation_failed` error (streams: the error event, then `[DONE]`; others: 500 in
//!   the OpenAI envelope) with no internals in it, and the server stays ready and gives
//!   the next request the text it gave before the fault.
//! - KIND device and hang lose the group: every in-flight request ends with the
//!   `engine_failed` error (streams as above; others: 503), `/readyz` answers 503 and new
//!   requests 503 `engine_failed`, the process exits with `ENGINE_FAILED_EXIT_CODE`, and
//!   detection takes less than the step timeout plus 5 s.
//!
//! `cargo test -p tessera-server --features fault-injection --test fault_injection -- --test-threads=1`

#![cfg(feature = "fault-injection")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use tessera_server::serve::ENGINE_FAILED_EXIT_CODE;

const STEP_TIMEOUT_SECS: u64 = 2;
/// Steps before the fault: the warm-up takes 4, the rest run the test's requests.
const AFTER_STEPS: u64 = 30;
/// Long enough that no request can finish before the fault.
const MAX_TOKENS: u64 = 400;

mod common;

use common::{Log, Server};

fn start(kind: &str) -> (Server, String, Log) {
    let started = start_node(Some(kind), &[]);
    (started.server, started.base, started.log)
}

/// `tessera serve` at TP = 2, with the fault armed when `kind` is given; `extra` adds
/// flags (node topology).
fn start_node(kind: Option<&str>, extra: &[&str]) -> common::Started {
    let fault = kind.map(|kind| format!("1:{kind}:{AFTER_STEPS}"));
    let step_timeout = STEP_TIMEOUT_SECS.to_string();
    let mut args = vec![
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "1024",
        "--step-timeout",
        &step_timeout,
    ];
    if let Some(fault) = &fault {
        args.extend(["--inject-fault", fault.as_str()]);
    }
    args.extend(extra);
    common::start_serve(&[], &args, &[("RUST_LOG", "info")])
}

/// TP = 2 over two processes (rank 1 in the worker node) with the fault armed on the
/// leader, which sends it to the worker node's rank: the leader and the worker.
fn start_two_nodes(kind: &str) -> (common::Started, common::Started) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port().to_string())
        .unwrap();
    let topology = |rank: &'static str| {
        vec![
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port,
        ]
    };
    let worker = start_node(None, &topology("1"));
    let leader = start_node(Some(kind), &topology("0"));
    (leader, worker)
}

async fn probe(client: &reqwest::Client, base: &str, path: &str) -> Option<(u16, Value)> {
    let resp = client.get(format!("{base}{path}")).send().await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.json().await.unwrap_or(Value::Null)))
}

fn body(chat: bool, stream: bool) -> (String, Value) {
    let mut b = json!({
        "model": "smollm2", "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": true, "stream": stream,
    });
    if chat {
        b["messages"] = json!([{"role": "user", "content": "Tell me a long story."}]);
        ("/v1/chat/completions".into(), b)
    } else {
        b["prompt"] = json!("Once upon a time");
        ("/v1/completions".into(), b)
    }
}

/// How an in-flight request ended, and when.
#[derive(Debug)]
struct Ending {
    what: String,
    status: u16,
    text: String,
    at: Instant,
}

async fn streaming(client: reqwest::Client, url: String, body: Value) -> Ending {
    let resp = client.post(&url).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let mut at = Instant::now();
    while let Some(chunk) = stream.next().await {
        let chunk = String::from_utf8_lossy(&chunk.expect("the stream ends cleanly")).to_string();
        if chunk.contains("\"error\"") {
            at = Instant::now();
        }
        text.push_str(&chunk);
    }
    Ending {
        what: format!("stream {url}"),
        status,
        text,
        at,
    }
}

async fn non_streaming(client: reqwest::Client, url: String, body: Value) -> Ending {
    let resp = client.post(&url).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    Ending {
        what: url,
        status,
        text,
        at: Instant::now(),
    }
}

/// Starts the four long requests (streaming or not, chat or completion) that are in
/// flight when the fault fires.
fn in_flight_requests(
    client: &reqwest::Client,
    base: &str,
) -> Vec<tokio::task::JoinHandle<Ending>> {
    let mut requests = Vec::new();
    for (chat, stream) in [(false, true), (true, true), (false, false), (true, false)] {
        let (path, b) = body(chat, stream);
        let url = format!("{base}{path}");
        requests.push(if stream {
            tokio::spawn(streaming(client.clone(), url, b))
        } else {
            tokio::spawn(non_streaming(client.clone(), url, b))
        });
    }
    requests
}

/// When the fault fired, from the server's log.
async fn fault_fired(logs: Log) -> (Instant, Log) {
    tokio::task::spawn_blocking(move || loop {
        let (at, line) = logs
            .recv_timeout(Duration::from_secs(120))
            .expect("the fault-injection line");
        if line.contains("fault injection: rank 1") {
            return (at, logs);
        }
    })
    .await
    .unwrap()
}

/// A request ended with the error `code` (`status` when not streamed), quickly.
fn assert_ended_with(e: &Ending, code: &str, status: u16, fault_at: Instant, kind: &str) {
    if e.what.starts_with("stream") {
        assert_eq!(e.status, 200, "{e:?}");
        let data: Vec<&str> = e
            .text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        let n = data.len();
        assert!(n >= 3, "{e:?}");
        assert_eq!(data[n - 1], "[DONE]", "{e:?}");
        let error: Value = serde_json::from_str(data[n - 2]).unwrap();
        assert_eq!(error["error"]["code"], code, "{e:?}");
        assert_eq!(error["error"]["type"], "server_error", "{e:?}");
        assert!(!e.text.contains("\"finish_reason\":\"length\""), "{e:?}");
        assert!(
            e.text.contains("\"text\"") || e.text.contains("\"content\""),
            "{}: no tokens before the fault, so it was not in flight",
            e.what
        );
    } else {
        assert_eq!(e.status, status, "{e:?}");
        let b: Value = serde_json::from_str(&e.text).unwrap();
        assert_eq!(b["error"]["code"], code, "{e:?}");
        assert_eq!(b["error"]["type"], "server_error", "{e:?}");
    }
    assert_no_internals(e);
    let took = e.at.saturating_duration_since(fault_at);
    println!("{kind}: {} ended {took:?} after the fault", e.what);
    let bound = Duration::from_secs(STEP_TIMEOUT_SECS + 5);
    assert!(took < bound, "{kind}: {} took {took:?}", e.what);
}

/// A short greedy completion: its status and text.
async fn short_completion(client: &reqwest::Client, base: &str) -> (u16, String) {
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"model": "smollm2", "prompt": "The capital of France is",
            "max_tokens": 8, "temperature": 0}),
        )
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    (
        status,
        body["choices"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

async fn step_failure_fails_its_requests_and_the_server_serves_on(kind: &str) {
    let (mut server, base, logs) = start(kind);
    let client = reqwest::Client::new();
    common::wait_ready(&client, &base, Duration::from_secs(300)).await;
    let before = short_completion(&client, &base).await;
    assert_eq!(before.0, 200, "{before:?}");
    assert!(!before.1.is_empty(), "{before:?}");

    let requests = in_flight_requests(&client, &base);
    let (fault_at, _logs) = fault_fired(logs).await;
    for request in requests {
        let e = request.await.unwrap();
        assert_ended_with(&e, "generation_failed", 500, fault_at, kind);
    }

    // Nothing else failed: the server is ready and serves as before.
    for path in ["/readyz", "/livez"] {
        let probe = probe(&client, &base, path).await;
        assert_eq!(
            probe.as_ref().map(|p| p.0),
            Some(200),
            "{kind}: {path} {probe:?}"
        );
    }
    assert_eq!(short_completion(&client, &base).await, before, "{kind}");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "tessera_step_failures_total 1"),
        "{kind}: {metrics}"
    );
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "{kind}: the server exited"
    );
}

/// Nothing about ranks, devices or the injected fault reaches a client.
fn assert_no_internals(e: &Ending) {
    for word in [
        "rank",
        "injected",
        "panic",
        "hung",
        "timeout",
        "did not finish",
    ] {
        assert!(
            !e.text.contains(word),
            "{}: `{word}` leaked: {}",
            e.what,
            e.text
        );
    }
}

async fn rank_failure_fails_in_flight_requests_then_exits(kind: &str) {
    let (server, base, logs) = start(kind);
    group_failure_fails_in_flight_requests_then_exits(kind, server, base, logs).await;
}

/// What a lost group looks like from the server that serves it (see the module doc).
async fn group_failure_fails_in_flight_requests_then_exits(
    kind: &str,
    mut server: Server,
    base: String,
    logs: Log,
) {
    let client = reqwest::Client::new();
    common::wait_ready(&client, &base, Duration::from_secs(300)).await;

    let requests = in_flight_requests(&client, &base);
    // The fault fires when the engine reaches its step.
    let (fault_at, _logs) = fault_fired(logs).await;

    // Readiness turns 503 once the failure is detected, and stays so until the exit.
    let mut not_ready_at = None;
    let limit = fault_at + Duration::from_secs(STEP_TIMEOUT_SECS + 5);
    while Instant::now() < limit {
        match probe(&client, &base, "/readyz").await {
            Some((503, b)) => {
                assert_eq!(b["reason"], "engine_failed", "{b}");
                not_ready_at = Some(Instant::now());
                break;
            }
            Some((200, _)) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => panic!("{kind}: /readyz answered {other:?}"),
        }
    }
    let not_ready_at = not_ready_at.expect("/readyz turned 503 in time");
    let live = probe(&client, &base, "/livez").await.expect("/livez");
    assert_eq!(live.0, 503, "{live:?}");
    let (path, b) = body(false, false);
    let refused = client
        .post(format!("{base}{path}"))
        .json(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"]["code"], "engine_failed", "{refused}");

    for request in requests {
        let e = request.await.unwrap();
        assert_ended_with(&e, "engine_failed", 503, fault_at, kind);
    }

    let exit_deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < exit_deadline, "{kind}: did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let exited_at = Instant::now();
    assert_eq!(
        status.code(),
        Some(i32::from(ENGINE_FAILED_EXIT_CODE)),
        "{kind}: {status:?}"
    );
    println!(
        "{kind}: not ready {:?} after the fault, exited {:?} after it",
        not_ready_at - fault_at,
        exited_at - fault_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_error() {
    step_failure_fails_its_requests_and_the_server_serves_on("error").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_panic() {
    step_failure_fails_its_requests_and_the_server_serves_on("panic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_device_lost() {
    rank_failure_fails_in_flight_requests_then_exits("device").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_hang() {
    rank_failure_fails_in_flight_requests_then_exits("hang").await;
}

/// The fault reaches rank 1 in the worker node's process through the leader's
/// connection; a lost device there loses the whole group, seen from the leader exactly
/// as a local rank's, and the worker node exits with the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_node_rank_device_lost() {
    let (leader, mut worker) = start_two_nodes("device");
    group_failure_fails_in_flight_requests_then_exits(
        "device on a worker node",
        leader.server,
        leader.base,
        leader.log,
    )
    .await;
    let armed = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        while let Ok((_, line)) = worker.log.recv_timeout(Duration::from_secs(30)) {
            seen.push(line);
        }
        let status = worker.server.0.wait().unwrap();
        (seen, status)
    })
    .await
    .unwrap();
    let (lines, status) = armed;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("fault Device armed on rank 1")),
        "the worker node armed the fault: {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("injected fault")),
        "the worker node's rank failed with it: {lines:?}"
    );
    assert_eq!(status.code(), Some(i32::from(ENGINE_FAILED_EXIT_CODE)));
}
