//! Every configurable limit refused with its status and an OpenAI error envelope:
//! `n`, stop strings, `logit_bias`, header size, connections, request time; and a
//! client that never reads its stream neither stalls others nor holds its sequence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tessera_protocol::{Executor, ExecutorError, KvCacheShape, StepOutput, StepPlan};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::harness::*;
use crate::api::valid_request::ValidationContext;
use crate::serve::routes;

#[tokio::test]
async fn n_stop_and_logit_bias_limits_are_400s_naming_the_parameter() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let many_stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let bias: serde_json::Map<String, Value> =
        (0..301).map(|i| (i.to_string(), json!(1))).collect();
    for (extra, param, says) in [
        (json!({"n": 17}), "n", "between 1 and 16"),
        (
            json!({"stop": many_stops}),
            "stop",
            "at most 16 stop strings",
        ),
        (json!({"stop": "x".repeat(257)}), "stop", "at most 256"),
        (json!({"logit_bias": bias}), "logit_bias", "at most 300"),
    ] {
        let (status, body) = post(&s.url("/v1/chat/completions"), &france(extra)).await;
        assert_error(status, &body, 400, Some(param));
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    // `n` times the number of prompts counts against the same limit.
    let (status, body) = post(
        &s.url("/v1/completions"),
        &json!({"model": "smollm2", "prompt": ["a", "b", "c"], "n": 6, "max_tokens": 1}),
    )
    .await;
    assert_error(status, &body, 400, Some("n"));
}

#[tokio::test]
async fn headers_over_the_limit_are_431() {
    let mut state = model_state().clone();
    state.limits.max_header_bytes = 1024;
    let s = start(state, &[]);
    let r = reqwest::Client::new()
        .get(s.url("/v1/models"))
        .header("x-filler", "f".repeat(2000))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_error(status, &body, 431, None);
    assert_eq!(body["error"]["code"], "headers_too_large");
    let r = reqwest::get(s.url("/v1/models")).await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn connections_over_the_limit_get_503_and_slots_free_up() {
    let app = routes::build_router(model_state().clone(), &[]);
    let base = serve_router_limited(app, Some(2));
    let addr = base.trim_start_matches("http://").to_string();
    // Both slots taken by requests in progress (their bodies still coming): unlike idle
    // connections, they are not closed for a new one, which is refused.
    let head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
    let mut a = tokio::net::TcpStream::connect(&addr).await.unwrap();
    a.write_all(head).await.unwrap();
    let mut b = tokio::net::TcpStream::connect(&addr).await.unwrap();
    b.write_all(head).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let r = fresh()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap();
    let status = r.status();
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = r.json().await.unwrap();
    assert_error(status, &body, 503, None);
    assert_eq!(body["error"]["code"], "too_many_connections");
    drop((a, b));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = fresh()
            .get(format!("{base}/v1/models"))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "slots never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn idle_connections_give_their_slots_to_new_ones() {
    let app = routes::build_router(model_state().clone(), &[]);
    let base = serve_router_limited(app, Some(2));
    let addr = base.trim_start_matches("http://").to_string();
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = reqwest::Client::new()
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The first idle connection was closed for it.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0))), "{read:?}");
}

/// A fake executor that sleeps `delay` per step, with a context of `context` tokens.
struct Paced {
    inner: FakeExecutor,
    context: usize,
}

impl Executor for Paced {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        self.inner.step(plan)
    }
    fn kv_cache_shape(&self) -> KvCacheShape {
        self.inner.kv
    }
    fn max_context_tokens(&self) -> usize {
        self.context
    }
}

fn paced_state(delay: Option<Duration>, num_blocks: usize) -> crate::serve::state::AppState {
    let context = num_blocks * 16;
    let inner = FakeExecutor {
        token: hello_token(),
        fail_at: None,
        fail_from: None,
        panic_at: None,
        step_delay: delay,
        steps: 0,
        kv: KvCacheShape::new(num_blocks, 16),
    };
    fake_state(Paced { inner, context }, num_blocks, context, 16)
}

async fn wait_idle(state: &crate::serve::state::AppState, within: Duration) {
    let deadline = Instant::now() + within;
    while state.lifecycle.in_flight() > 0 || state.scheduler.metrics().num_running > 0 {
        assert!(Instant::now() < deadline, "the sequence was not cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn requests_over_the_time_limit_are_cancelled_with_408() {
    let mut state = paced_state(Some(Duration::from_millis(20)), 256);
    state.limits.request_timeout = Some(Duration::from_millis(500));
    let s = start(state.clone(), &[]);
    let body = json!({"model": "fake", "prompt": "Hi", "max_tokens": 1000, "ignore_eos": true});
    let started = Instant::now();
    let (status, err) = post(&s.url("/v1/completions"), &body).await;
    assert_error(status, &err, 408, None);
    assert_eq!(err["error"]["code"], "request_timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    wait_idle(&state, Duration::from_secs(5)).await;

    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let (status, events) = post_sse(&s.url("/v1/completions"), &stream).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "request_timeout", "{error}");
    wait_idle(&state, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_client_that_never_reads_its_stream_is_cut_off_without_stalling_others() {
    // A context large enough that the stream would run for long: 3.2M tokens.
    let mut state = paced_state(None, 200_000);
    state.limits.stream_buffer_events = 4;
    state.limits.stream_stall_timeout = Duration::from_millis(500);
    state.validation = Arc::new(ValidationContext {
        max_model_len: 3_000_000,
        ..ValidationContext::clone(&state.validation)
    });
    let s = start(state.clone(), &[]);
    let max_tokens = 2_500_000u64;

    // A raw client with a tiny receive buffer that sends a request and never reads.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    let body = json!({"model": "fake", "prompt": "Hi", "max_tokens": max_tokens,
                      "ignore_eos": true, "stream": true})
    .to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stalled.write_all(request.as_bytes()).await.unwrap();

    // Others are served meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let (status, done) = post(
            &s.url("/v1/completions"),
            &json!({"model": "fake", "prompt": "Hi", "max_tokens": 5, "ignore_eos": true}),
        )
        .await;
        assert_eq!(status, 200, "{done}");
        assert_eq!(done["usage"]["completion_tokens"], 5);
    }
    // The stalled stream is cancelled while its client still holds the socket, before
    // its max_tokens: what it held is bounded by the socket buffers, the stream buffer
    // and what the engine made during one stall timeout.
    wait_idle(&state, Duration::from_secs(30)).await;
    let generated = state.scheduler.metrics().generation_tokens_total;
    eprintln!("the stalled stream was cancelled after {generated} tokens");
    assert!(generated < max_tokens, "{generated} tokens generated");
    drop(stalled);
}

/// More headers than hyper parses: hyper answers 431 itself, before any route runs, and
/// the answer still comes in the OpenAI error envelope.
#[tokio::test]
async fn headers_hyper_refuses_are_431_in_the_envelope() {
    let app = routes::build_router(model_state().clone(), &[]);
    let base = serve_router_limited(app, Some(16));
    let client = reqwest::Client::new();
    let mut request = client.get(format!("{base}/v1/models"));
    for i in 0..150 {
        request = request.header(format!("x-filler-{i}"), "f");
    }
    let r = request.send().await.unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_error(status, &body, 431, None);
    assert_eq!(body["error"]["code"], "headers_too_large");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let r = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
