//! A group of nodes end to end: real `tessera serve` processes on this machine, CPU
//! ranks, real sockets. N nodes of k ranks give the greedy text of TP = N·k in one
//! process (the TCP collectives sum in the in-process order, so the logits are the
//! same bits); many concurrent requests through the leader each get the text they get
//! alone; a killed worker ends the streams with `engine_failed` and the leader exits
//! 75; a worker exits when its leader goes away, when its model differs from the
//! leader's (naming the mismatch) and when no leader appears.
//!
//! `cargo test -p tessera-server --test multi_node -- --test-threads=1`

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::TcpListener;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use common::{Log, Server, Started};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tessera_server::serve::ENGINE_FAILED_EXIT_CODE;

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
];
const MAX_TOKENS: u64 = 12;

/// A free port for a rendezvous, below the ephemeral range (32768 and up on Linux): the
/// nodes' HTTP servers take ephemeral ports, and one of them may otherwise be handed the
/// rendezvous port before the leader binds it.
fn free_port() -> String {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 4_000) as u16;
    (0..8_000u16)
        .map(|_| base + NEXT.fetch_add(7, std::sync::atomic::Ordering::Relaxed) % 8_000)
        .find(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range")
        .to_string()
}

/// Node `rank` of `nnodes` with `tp` ranks in all, rendezvous at 127.0.0.1:`port`.
fn node(tp: usize, nnodes: usize, rank: usize, port: &str, extra: &[&str]) -> Started {
    node_waiting(tp, nnodes, rank, port, "120", extra)
}

/// A leader and one worker node with `tp` ranks in all and the given step timeout, the
/// worker started first; `(leader, worker)`.
fn two_nodes(tp: usize, step_timeout: &str) -> (Started, Started) {
    let port = free_port();
    let worker = node(tp, 2, 1, &port, &["--step-timeout", step_timeout]);
    let leader = node(tp, 2, 0, &port, &["--step-timeout", step_timeout]);
    (leader, worker)
}

fn node_waiting(
    tp: usize,
    nnodes: usize,
    rank: usize,
    port: &str,
    join_timeout: &str,
    extra: &[&str],
) -> Started {
    let (tp, nnodes, rank) = (tp.to_string(), nnodes.to_string(), rank.to_string());
    let mut args = vec![
        "--tensor-parallel-size",
        &tp,
        "--nnodes",
        &nnodes,
        "--node-rank",
        &rank,
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        port,
        "--node-join-timeout",
        join_timeout,
    ];
    args.extend(extra);
    common::start_serve(&[], &args, &[("RUST_LOG", "info")])
}

async fn completion(client: &reqwest::Client, base: &str, prompt: &str) -> String {
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"model": "smollm2", "prompt": prompt, "max_tokens": MAX_TOKENS,
                      "temperature": 0, "ignore_eos": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["choices"][0]["text"].as_str().unwrap().to_string()
}

async fn texts(client: &reqwest::Client, base: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in PROMPTS {
        out.push(completion(client, base, p).await);
    }
    out
}

/// The greedy texts of TP = `tp` in one process.
async fn one_process_texts(client: &reqwest::Client, tp: usize) -> Vec<String> {
    let tp = tp.to_string();
    let single = common::start_serve(&[], &["--tensor-parallel-size", &tp], &[]);
    common::wait_ready(client, &single.base, Duration::from_secs(300)).await;
    texts(client, &single.base).await
}

/// Waits for the process to exit (a guard against hangs, not a timing check).
fn exit_status(server: &mut Server) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the process never exited");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The log lines until the process exits.
fn rest_of_log(log: &Log) -> String {
    let mut all = String::new();
    while let Ok((_, line)) = log.recv_timeout(Duration::from_secs(5)) {
        all.push_str(&line);
        all.push('\n');
    }
    all
}

async fn stream_until_it_ends(
    client: reqwest::Client,
    base: String,
    tokens: tokio::sync::mpsc::Sender<()>,
) -> String {
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"model": "smollm2", "prompt": "Tell me a long story.", "max_tokens": 400,
                      "temperature": 0, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        let chunk = String::from_utf8_lossy(&chunk.expect("the stream ends cleanly")).to_string();
        if chunk.contains("\"text\"") {
            let _ = tokens.try_send(());
        }
        text.push_str(&chunk);
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_of_one_rank_serve_as_tp2_and_a_killed_worker_fails_the_leader() {
    let client = reqwest::Client::new();
    let want = one_process_texts(&client, 2).await;

    let (leader, mut worker) = two_nodes(2, "10");
    common::wait_ready(&client, &leader.base, Duration::from_secs(300)).await;
    common::wait_ready(&client, &worker.base, Duration::from_secs(60)).await;
    // A worker serves no API.
    let api = client
        .get(format!("{}/v1/models", worker.base))
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 404);

    assert_eq!(texts(&client, &leader.base).await, want);

    // Sixteen requests at once: each gets the text it gets alone.
    let concurrent: Vec<_> = (0..16)
        .map(|i| {
            let (client, base) = (client.clone(), leader.base.clone());
            tokio::spawn(async move { completion(&client, &base, PROMPTS[i % 4]).await })
        })
        .collect();
    for (i, r) in concurrent.into_iter().enumerate() {
        assert_eq!(r.await.unwrap(), want[i % 4], "request {i}");
    }

    // kill -9 the worker while two streams run.
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let streams: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(stream_until_it_ends(
                client.clone(),
                leader.base.clone(),
                tx.clone(),
            ))
        })
        .collect();
    drop(tx);
    for _ in 0..4 {
        rx.recv().await.expect("tokens before the kill");
    }
    worker.server.0.kill().unwrap();
    let killed_at = Instant::now();
    for s in streams {
        let text = s.await.unwrap();
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        let n = data.len();
        assert!(n >= 3, "{text}");
        assert_eq!(data[n - 1], "[DONE]");
        let error: Value = serde_json::from_str(data[n - 2]).unwrap();
        assert_eq!(error["error"]["code"], "engine_failed", "{text}");
    }
    let mut leader_server = leader.server;
    let status = exit_status(&mut leader_server);
    println!("the leader exited {:?} after the kill", killed_at.elapsed());
    assert_eq!(status.code(), Some(i32::from(ENGINE_FAILED_EXIT_CODE)));
    let _ = exit_status(&mut worker.server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_of_two_ranks_serve_as_tp4_and_a_worker_exits_when_its_leader_dies() {
    let client = reqwest::Client::new();
    let want = one_process_texts(&client, 4).await;

    let (mut leader, mut worker) = two_nodes(4, "10");
    common::wait_ready(&client, &leader.base, Duration::from_secs(300)).await;
    assert_eq!(texts(&client, &leader.base).await, want);

    // The worker's probes answer as the leader's do: JSON, with the request's id.
    for path in ["/livez", "/readyz"] {
        let resp = client
            .get(format!("{}{path}", worker.base))
            .header("x-request-id", "probe-7")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.headers()["x-request-id"], "probe-7", "{path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body, json!({"status": "ok"}), "{path}");
    }

    // The leader goes away: the worker exits, asking for a restart.
    leader.server.0.kill().unwrap();
    let _ = exit_status(&mut leader.server);
    let status = exit_status(&mut worker.server);
    assert_eq!(status.code(), Some(i32::from(ENGINE_FAILED_EXIT_CODE)));
    let log = rest_of_log(&worker.log);
    assert!(log.contains("the leader closed the connection"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_with_another_model_is_refused_naming_the_mismatch() {
    let port = free_port();
    let mut leader = node(2, 2, 0, &port, &[]);
    let other = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/models/tiny-qwen3.gguf"
    );
    let mut worker = node(2, 2, 1, &port, &["--model", other]);
    let status = exit_status(&mut worker.server);
    assert_eq!(status.code(), Some(1));
    let log = rest_of_log(&worker.log);
    assert!(
        log.contains("refused this node at rendezvous")
            && log.contains("--model (the file's contents) differs"),
        "{log}"
    );
    // The leader is still waiting for a node that agrees: not ready.
    let client = reqwest::Client::new();
    let ready = client
        .get(format!("{}/readyz", leader.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    leader.server.0.kill().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_leader_never_appears_exits_with_an_error() {
    let port = free_port();
    let mut worker = node_waiting(2, 2, 1, &port, "2", &[]);
    let status = exit_status(&mut worker.server);
    assert_eq!(status.code(), Some(1));
    let log = rest_of_log(&worker.log);
    assert!(log.contains("no leader at 127.0.0.1:"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_worker_fails_the_streams_and_the_leader_exits_75() {
    let client = reqwest::Client::new();
    let (leader, mut worker) = two_nodes(2, "3");
    common::wait_ready(&client, &leader.base, Duration::from_secs(300)).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let stream = tokio::spawn(stream_until_it_ends(
        client.clone(),
        leader.base.clone(),
        tx,
    ));
    for _ in 0..4 {
        rx.recv().await.expect("tokens before the worker hangs");
    }
    // The worker stops answering without closing anything, as a hung machine would.
    let pid = worker.server.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let text = stream.await.unwrap();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    let n = data.len();
    assert!(n >= 3, "{text}");
    assert_eq!(data[n - 1], "[DONE]");
    let error: Value = serde_json::from_str(data[n - 2]).unwrap();
    assert_eq!(error["error"]["code"], "engine_failed", "{text}");
    let mut leader_server = leader.server;
    let status = exit_status(&mut leader_server);
    assert_eq!(status.code(), Some(i32::from(ENGINE_FAILED_EXIT_CODE)));
    let log = rest_of_log(&leader.log);
    assert!(
        log.contains("rank 1") || log.contains("node 1"),
        "the log names the hung node: {log}"
    );
    worker.server.0.kill().unwrap();
    let _ = exit_status(&mut worker.server);
}

/// Starts a 2 × 1 group with a 3 s step timeout, waits until the leader is ready, then
/// does `harm` to the idle worker. With no request in flight the leader must hear of it
/// from its pings, fail and exit 75, its log naming the node.
async fn an_idle_worker_harmed_fails_the_leader(harm: &str, expect_in_log: &str) {
    let client = reqwest::Client::new();
    let (leader, mut worker) = two_nodes(2, "3");
    common::wait_ready(&client, &leader.base, Duration::from_secs(300)).await;
    let pid = worker.server.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args([harm, &pid])
        .status()
        .unwrap()
        .success());
    let mut leader_server = leader.server;
    let status = exit_status(&mut leader_server);
    assert_eq!(status.code(), Some(i32::from(ENGINE_FAILED_EXIT_CODE)));
    let log = rest_of_log(&leader.log);
    assert!(log.contains(expect_in_log), "{log}");
    let _ = worker.server.0.kill();
    let _ = exit_status(&mut worker.server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_while_idle_fails_the_leader_without_a_request() {
    an_idle_worker_harmed_fails_the_leader("-KILL", "node 1 disconnected while idle").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_hung_while_idle_fails_the_leader_without_a_request() {
    an_idle_worker_harmed_fails_the_leader("-STOP", "node 1 did not answer while idle").await;
}
