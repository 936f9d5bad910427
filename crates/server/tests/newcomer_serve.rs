//! `tessera serve` as a newcomer starts it with a small KV cache: start-up warns that
//! the cache holds less than the context and names the flags that change it, and the
//! warm-up generation is not counted in the token, prefix-cache and queue-time metrics.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

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
