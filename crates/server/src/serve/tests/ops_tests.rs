//! Operations: the probes through start-up, engine failure and drain; request ids;
//! `/metrics` parsed with a real Prometheus text-format parser.

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use tessera_protocol::KvCacheShape;

use super::harness::*;
use crate::serve::drain;
use crate::serve::lifecycle::{Lifecycle, FAILED_STEPS_UNHEALTHY};
use crate::serve::middleware::Front;
use crate::serve::routes::{api_router, startup_router};

fn chat(extra: Value) -> Value {
    let mut body =
        json!({"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// `(status, reason)` of a probe.
async fn probe(base: &str, path: &str) -> (u16, Option<String>) {
    let (status, body) = get(&format!("{base}{path}")).await;
    let reason = body["reason"].as_str().map(str::to_string);
    if status == 200 {
        assert_eq!(body, json!({"status": "ok"}), "{path}");
    } else {
        assert_eq!(body["status"], "unavailable", "{path}: {body}");
    }
    (status.as_u16(), reason)
}

fn fake_executor() -> FakeExecutor {
    FakeExecutor {
        token: 0,
        fail_at: None,
        fail_from: None,
        panic_at: None,
        step_delay: None,
        steps: 0,
        kv: KvCacheShape::new(64, 16),
    }
}

#[tokio::test]
async fn probes_answer_while_loading_then_the_api_takes_over() {
    let lifecycle = Arc::new(Lifecycle::default());
    let api = Arc::new(OnceLock::new());
    let front = Front {
        metrics: Default::default(),
        limits: Default::default(),
        api_keys: Default::default(),
        max_body_bytes: 1 << 20,
    };
    let base = serve_router(startup_router(
        Arc::clone(&lifecycle),
        &front,
        &[],
        Arc::clone(&api),
        true,
    ));

    assert_eq!(probe(&base, "/livez").await, (200, None));
    assert_eq!(
        probe(&base, "/startupz").await,
        (503, Some("loading".into()))
    );
    assert_eq!(probe(&base, "/readyz").await, (503, Some("loading".into())));
    assert_eq!(probe(&base, "/health").await, (503, Some("loading".into())));
    let resp = reqwest::get(format!("{base}/v1/models")).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().get("retry-after").is_some());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_loading", "{body}");
    // Probes echo the client's request id, or mint one, as every route does.
    let client = reqwest::Client::new();
    for path in ["/livez", "/startupz", "/readyz", "/health"] {
        let resp = client
            .get(format!("{base}{path}"))
            .header("x-request-id", "probe-42")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["x-request-id"], "probe-42", "{path}");
        let resp = client.get(format!("{base}{path}")).send().await.unwrap();
        let minted = resp.headers()["x-request-id"].to_str().unwrap();
        assert!(minted.len() >= 16, "{path}: {minted}");
    }
    // `/metrics` answers while the model loads, with what the server has counted: the
    // probes just sent.
    let resp = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("tessera_http_requests_total{route=\"/livez\",status=\"200\"} 3"),
        "{text}"
    );
    // The chat page is there from the start.
    let resp = reqwest::get(format!("{base}/")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().contains("<title>"));

    // Loaded, then warmed up: the same lifecycle, now behind a real API router.
    let fake = fake_server_with(fake_executor(), 16);
    lifecycle.set_loaded(fake.state.scheduler.clone());
    assert_eq!(
        probe(&base, "/startupz").await,
        (503, Some("warming_up".into()))
    );
    let mut state = fake.state.clone();
    state.lifecycle = Arc::clone(&lifecycle);
    api.set(api_router(state)).unwrap();
    lifecycle.set_started();
    for path in ["/livez", "/startupz", "/readyz", "/health"] {
        assert_eq!(probe(&base, path).await, (200, None), "{path}");
    }
    let (status, models) = get(&format!("{base}/v1/models")).await;
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "fake");
}

#[tokio::test]
async fn draining_turns_readiness_off_but_not_liveness() {
    let s = fake_server_with(fake_executor(), 16);
    assert_eq!(probe(&s.base, "/readyz").await, (200, None));
    s.state.lifecycle.set_draining();
    s.state.scheduler.close_admission();
    assert_eq!(
        probe(&s.base, "/readyz").await,
        (503, Some("draining".into()))
    );
    assert_eq!(
        probe(&s.base, "/health").await,
        (503, Some("draining".into()))
    );
    assert_eq!(probe(&s.base, "/livez").await, (200, None));
    assert_eq!(probe(&s.base, "/startupz").await, (200, None));
    let (status, body) = post(&s.url("/v1/chat/completions"), &chat(json!({}))).await;
    assert_error(status, &body, 503, None);
    assert_eq!(body["error"]["code"], "shutting_down");
}

#[tokio::test]
async fn an_executor_failing_step_after_step_is_not_ready_nor_live() {
    let s = fake_server_with(
        FakeExecutor {
            fail_from: Some(1),
            ..fake_executor()
        },
        16,
    );
    for i in 0..FAILED_STEPS_UNHEALTHY {
        assert_eq!(probe(&s.base, "/readyz").await.0, 200, "after {i} failures");
        let (status, body) = post(&s.url("/v1/chat/completions"), &chat(json!({}))).await;
        assert_error(status, &body, 500, None);
        assert_eq!(body["error"]["code"], "generation_failed");
    }
    let failing = (503, Some("engine_failing".to_string()));
    assert_eq!(probe(&s.base, "/readyz").await, failing);
    assert_eq!(probe(&s.base, "/livez").await, failing);
    let m = scraped_metrics(&s).await;
    assert_eq!(
        m["tessera_step_failures_total"],
        f64::from(FAILED_STEPS_UNHEALTHY)
    );
}

#[tokio::test]
async fn a_panicked_engine_loop_is_not_ready_nor_live() {
    let s = fake_server_with(
        FakeExecutor {
            panic_at: Some(1),
            ..fake_executor()
        },
        16,
    );
    let (status, body) = post(&s.url("/v1/chat/completions"), &chat(json!({}))).await;
    assert_error(status, &body, 503, None);
    let stopped = (503, Some("engine_stopped".to_string()));
    assert_eq!(probe(&s.base, "/readyz").await, stopped);
    assert_eq!(probe(&s.base, "/livez").await, stopped);
}

#[tokio::test]
async fn probes_need_no_api_key() {
    let mut state = fake_server_with(fake_executor(), 16).state;
    state.api_keys = Arc::new(vec!["sk-test".to_string()]);
    let s = start(state, &[]);
    for path in ["/livez", "/readyz", "/startupz", "/health"] {
        assert_eq!(probe(&s.base, path).await, (200, None), "{path}");
    }
    let resp = reqwest::get(s.url("/metrics")).await.unwrap();
    assert_eq!(resp.status(), 401);
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated() {
    let s = fake_server_with(fake_executor(), 16);
    let client = reqwest::Client::new();
    let resp = client
        .post(s.url("/v1/chat/completions"))
        .header("x-request-id", "trace-abc-123")
        .json(&chat(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "trace-abc-123");
    // Absent, or not a sane header value: a fresh id each time.
    let mut seen = Vec::new();
    for sent in [None, Some("has space")] {
        let mut req = client.get(s.url("/v1/models"));
        if let Some(v) = sent {
            req = req.header("x-request-id", v);
        }
        let resp = req.send().await.unwrap();
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(id.len() >= 16 && Some(id.as_str()) != sent, "{id}");
        seen.push(id);
    }
    assert_ne!(seen[0], seen[1]);
    // Unknown routes get one too.
    let resp = client.get(s.url("/nope")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert!(resp.headers().contains_key("x-request-id"));
}

#[tokio::test]
async fn metrics_parse_and_move_after_real_requests() {
    // Exclusive: every count below is exact, so nothing else may run meanwhile.
    let _gate = SCHEDULER_GATE.write().await;
    let s = model_server();
    let body = metrics_text(s).await;
    assert!(body.contains("model_name=\"smollm2\""), "{body}");
    let listed = scrape(&body);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "tessera_step_duration_seconds_count",
        "tessera_kv_blocks_total",
        "tessera_num_requests_running",
    ] {
        assert!(listed.contains_key(name), "missing {name} in\n{body}");
    }

    // A prompt no other test sends, twice, 4 tokens each (ignore_eos: never fewer). The
    // prefix cache may hold the blocks it shares with other chats (the template's system
    // turn), from earlier tests or, for sure, from a chat sent first here.
    let unique = json!({
        "max_tokens": 4,
        "ignore_eos": true,
        "messages": [{"role": "user", "content": "Which metrics does this test read? Name three."}],
    });
    let (status, _) = post(
        &s.url("/v1/chat/completions"),
        &france(json!({"max_tokens": 1})),
    )
    .await;
    assert_eq!(status, 200);
    let tokens = |body: Value| async move {
        let (_, tok) = post(&s.url("/tokenize"), &body).await;
        tok["tokens"].as_array().unwrap().clone()
    };
    let shared = tokens(json!({"messages": france(json!({}))["messages"]})).await;
    let mine = tokens(json!({"messages": unique["messages"]})).await;
    let common = shared.iter().zip(&mine).take_while(|(a, b)| a == b).count() as f64;
    let full_blocks = |n: f64| (n / 16.0).floor() * 16.0;
    let before = scraped_metrics(s).await;
    let (status, reply) = post(&s.url("/v1/chat/completions"), &france(unique.clone())).await;
    assert_eq!(status, 200);
    let prompt = reply["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(prompt, mine.len() as f64);
    assert_eq!(reply["usage"]["completion_tokens"], 4);
    assert_eq!(
        reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_f64(),
        Some(full_blocks(common)),
        "{reply}"
    );
    let mut streamed = unique;
    streamed["stream"] = json!(true);
    let (status, events) = post_sse(&s.url("/v1/chat/completions"), &france(streamed)).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));

    // The engine loop publishes its counters after each step, which may be just after
    // the last response went out: read them once they have settled.
    let mut after = scraped_metrics(s).await;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let again = scraped_metrics(s).await;
        let settled = ["vllm:generation_tokens_total", "tessera_steps_total"]
            .iter()
            .all(|k| again.get(*k) == after.get(*k));
        after = again;
        if settled {
            break;
        }
    }
    let grew = |name: &str, by: f64| {
        let (b, a) = (before.get(name).copied().unwrap_or(0.0), after[name]);
        assert_eq!(a - b, by, "{name}: {b} -> {a}");
    };
    let grew_some = |name: &str| {
        let (b, a) = (before.get(name).copied().unwrap_or(0.0), after[name]);
        assert!(a > b, "{name}: {b} -> {a}");
    };
    grew("vllm:prompt_tokens_total", 2.0 * prompt);
    grew("vllm:generation_tokens_total", 8.0);
    grew("vllm:prefix_cache_queries_total", 2.0 * prompt);
    // The first finds the blocks it shares with the chat before; the second, the
    // first's (all but the last token, computed again for its logits).
    grew(
        "vllm:prefix_cache_hits_total",
        full_blocks(common) + full_blocks(prompt - 1.0),
    );
    grew("vllm:time_to_first_token_seconds_count", 2.0);
    // One gap between each two of a sequence's 4 tokens.
    grew("vllm:inter_token_latency_seconds_count", 6.0);
    grew("vllm:e2e_request_latency_seconds_count", 2.0);
    grew_some("vllm:e2e_request_latency_seconds_sum");
    grew("vllm:request_queue_time_seconds_count", 2.0);
    // For each: a prefill step and three decode steps on the ranks, and for the loop
    // also the step that tells the engine the sequence ended (which may instead ride on
    // the next request's first step).
    grew("tessera_rank_steps_total{rank=\"0\"}", 8.0);
    let name = "tessera_step_duration_seconds_count";
    let steps = after[name] - before.get(name).copied().unwrap_or(0.0);
    assert!((9.0..=10.0).contains(&steps), "{name}: {steps}");
    // CPU ranks replay no graph.
    assert_eq!(
        after.get("tessera_rank_graph_steps_total{rank=\"0\"}"),
        Some(&0.0)
    );
    grew_some("tessera_rank_step_seconds_total{rank=\"0\"}");
    grew_some("tessera_rank_collective_seconds_total{rank=\"0\"}");
    grew(
        "tessera_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}",
        2.0,
    );
    // The scrapes before the last (a response is counted once it has started).
    let name = "tessera_http_requests_total{route=\"/metrics\",status=\"200\"}";
    assert!(after[name] - before[name] >= 2.0, "{name}");
}

#[tokio::test]
async fn drain_waits_then_aborts_what_outlives_the_timeout() {
    let s = fake_server_with(
        FakeExecutor {
            step_delay: Some(std::time::Duration::from_millis(10)),
            ..fake_executor()
        },
        16,
    );
    let resp = reqwest::Client::new()
        .post(s.url("/v1/chat/completions"))
        .json(&chat(
            json!({"max_tokens": 500, "stream": true, "ignore_eos": true}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = futures_util::StreamExt::boxed(resp.bytes_stream());
    let mut text = String::new();
    while !text.contains("hello") {
        let chunk = futures_util::StreamExt::next(&mut body)
            .await
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(s.state.lifecycle.in_flight(), 1);
    let state = s.state.clone();
    let drained = tokio::spawn(async move {
        drain(&state, std::time::Duration::from_millis(300)).await;
    });
    while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    drained.await.unwrap();
    // 500 tokens at 10 ms each outlive 300 ms: the stream ends with a clear reason.
    let events = sse_data(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "shutting_down", "{error}");
    assert_eq!(s.state.lifecycle.in_flight(), 0);
    assert_eq!(
        probe(&s.base, "/readyz").await,
        (503, Some("draining".into()))
    );
}

/// The gauges under a known load: a KV cache that holds one request at a time and three
/// requests sent, so one runs and two wait. Each waiting request counts once (it is both
/// admitted and in the scheduler's queue; it was once counted in both).
#[tokio::test]
async fn gauges_count_each_waiting_request_once() {
    let executor = FakeExecutor {
        token: hello_token(),
        step_delay: Some(std::time::Duration::from_millis(150)),
        kv: KvCacheShape::new(2, 16),
        ..fake_executor()
    };
    let s = start(fake_state(executor, 2, 1024, 16), &[]);
    // 17 prompt tokens take both blocks, so the next request waits for them.
    let body = json!({"model": "fake", "prompt": (1..=17).collect::<Vec<u32>>(),
        "max_tokens": 8, "ignore_eos": true});
    let requests: Vec<_> = (0..3)
        .map(|_| {
            let (url, body) = (s.url("/v1/completions"), body.clone());
            tokio::spawn(async move { post(&url, &body).await })
        })
        .collect();
    let gauges = || async {
        let m = scraped_metrics(&s).await;
        [
            m["vllm:num_requests_running"],
            m["vllm:num_requests_waiting"],
            m["tessera_num_requests_running"],
            m["tessera_num_requests_waiting"],
        ]
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = gauges().await;
    // Until all three have arrived (the first runs 9 steps of 150 ms, the others wait
    // all that while).
    while seen[0] != 1.0 || seen[1] < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "never loaded: {seen:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        seen = gauges().await;
    }
    assert_eq!(seen, [1.0, 2.0, 1.0, 2.0]);
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    // The loop publishes right after the step that finished the last one.
    let mut idle = gauges().await;
    while idle[0] != 0.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        idle = gauges().await;
    }
    assert_eq!(idle, [0.0, 0.0, 0.0, 0.0]);
}

/// The metric names the README's "Metrics" section gives, `a_{b,c}` spelled out and
/// label lists (`{route,status}`) dropped.
fn readme_metric_names() -> std::collections::BTreeSet<String> {
    let readme = include_str!("../../../../../README.md");
    let start = readme.find("### Metrics").expect("a Metrics section");
    let section = &readme[start..];
    let section = &section[..section[4..].find("\n### ").map_or(section.len(), |e| e + 4)];
    let mut names = std::collections::BTreeSet::new();
    for quoted in section.split('`').skip(1).step_by(2) {
        if !(quoted.starts_with("vllm:") || quoted.starts_with("tessera_")) {
            continue;
        }
        match quoted.split_once('{') {
            Some((stem, rest)) if stem.ends_with('_') => {
                for alt in rest.trim_end_matches('}').split(',') {
                    names.insert(format!("{stem}{alt}"));
                }
            }
            Some((name, _)) => {
                names.insert(name.to_string());
            }
            None => {
                names.insert(quoted.to_string());
            }
        }
    }
    names
}

#[tokio::test]
async fn every_exported_metric_is_in_the_readme_and_every_documented_one_exported() {
    let _gate = SCHEDULER_GATE.read().await;
    let text = metrics_text(model_server()).await;
    let exported: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let documented = readme_metric_names();
    let undocumented: Vec<&String> = exported.difference(&documented).collect();
    let missing: Vec<&String> = documented.difference(&exported).collect();
    assert!(
        undocumented.is_empty(),
        "not in the README: {undocumented:?}"
    );
    assert!(missing.is_empty(), "documented, not exported: {missing:?}");
    assert!(exported.len() > 20, "{exported:?}");
}
