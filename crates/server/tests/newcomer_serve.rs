//! `tessera serve` as a newcomer starts it with a small KV cache: start-up warns that
//! the cache holds less than the context and names the flags that change it, and the
//! warm-up generation is not counted in the token, prefix-cache and queue-time metrics.
//! A second signal during a drain ends the process at once, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;

mod common;

/// The value of the sample `name` (with its labels) in a Prometheus text exposition.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (key == name).then(|| value.parse::<f64>().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_kv_cache_is_warned_of_and_the_warm_up_is_not_traffic() {
    // 4 MiB holds a few dozen of SmolLM2's tokens, far fewer than 2048.
    let started = common::start(
        &[
            "serve",
            "--port",
            "0",
            "--served-model-name",
            "smollm2",
            "--kv-cache-memory-mib",
            "4",
            "--max-model-len",
            "2048",
            "--threads-per-rank",
            "1",
        ],
        &[("RUST_LOG", "info")],
    );
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let logged: Vec<String> = started
        .early
        .iter()
        .cloned()
        .chain(started.log.try_iter().map(|(_, line)| line))
        .collect();
    let warning = logged
        .iter()
        .find(|l| l.contains("WARN") && l.contains("the KV cache holds"))
        .unwrap_or_else(|| panic!("no KV cache warning in {logged:?}"));
    assert!(
        warning.contains("fewer than max_model_len 2048")
            && warning.contains("--kv-cache-memory-mib")
            && warning.contains("--max-model-len"),
        "{warning}"
    );
    assert!(
        logged.iter().any(|l| l.contains("warm-up: 4 tokens in")),
        "no warm-up in {logged:?}"
    );

    let metrics = client
        .get(format!("{}/metrics", started.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let model = "{model_name=\"smollm2\"}";
    for name in [
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_queue_time_seconds_count",
    ] {
        assert_eq!(
            sample(&metrics, &format!("{name}{model}")),
            0.0,
            "{name} counts the warm-up"
        );
    }
    // The steps did run: the engine's own step count includes the warm-up.
    assert!(sample(&metrics, "tessera_steps_total") > 0.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_during_the_drain_exits_at_once_saying_so() {
    let started = common::start(
        &[
            "serve",
            "--port",
            "0",
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "1024",
            "--kv-cache-memory-mib",
            "64",
            "--threads-per-rank",
            "1",
            "--shutdown-timeout",
            "300",
        ],
        &[("RUST_LOG", "info")],
    );
    let mut server = started.server;
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    // A stream far longer than the test: the drain would wait for it.
    let resp = client
        .post(format!("{}/v1/completions", started.base))
        .json(
            &json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 1000,
                      "temperature": 0, "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    while !text.contains("\"text\"") {
        let chunk = body.next().await.expect("stream open").unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let pid = server.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // The first signal is taken: the drain has begun.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("shutting down:")) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, line) = started
            .log
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no drain in {seen:?}"));
        seen.push(line);
    }
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running after a second signal"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(130), "{status:?}");
    seen.extend(started.log.try_iter().map(|(_, line)| line));
    assert!(
        seen.iter()
            .any(|l| l.contains("second interrupt: exiting now, without waiting")),
        "{seen:?}"
    );
}
