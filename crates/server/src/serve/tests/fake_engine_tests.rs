//! Failures the real engine cannot be made to produce on demand, over a fake executor:
//! engine errors mid-stream and before the first token, a full queue, shutdown, and a
//! request larger than the whole KV cache.

use serde_json::{json, Value};

use super::harness::*;

fn chat(extra: Value) -> Value {
    let mut body =
        json!({"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn engine_error_mid_stream_sends_error_event_then_done() {
    // Step 1 is the prefill (first token); step 4 fails after a few tokens.
    let s = fake_server(Some(4), 64, 16);
    let (status, events) = post_sse(
        &s.url("/v1/chat/completions"),
        &chat(json!({"stream": true})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], "server_error");
    assert_eq!(error["error"]["code"], "generation_failed");
    assert!(error["error"].get("param").is_some() && error["error"].get("code").is_some());
    assert!(!events.concat().contains("SECRET-INTERNAL-DETAIL"));
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("request id "), "{message}");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let text: String = events[1..events.len() - 2]
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert!(text.contains("hello"), "{events:?}");
}

/// A failed step fails its request with a 500 (the engine goes on serving others, so
/// no `Retry-After`); the next request is served.
#[tokio::test]
async fn a_failed_step_without_stream_is_500_without_internals() {
    let s = fake_server(Some(1), 64, 16);
    let resp = reqwest::Client::new()
        .post(s.url("/v1/chat/completions"))
        .json(&chat(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 500);
    assert!(resp.headers().get("retry-after").is_none());
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let text = resp.text().await.unwrap();
    assert!(!text.contains("SECRET-INTERNAL-DETAIL"), "{text}");
    assert!(!text.contains("rank") && !text.contains('/'), "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_error(reqwest::StatusCode::INTERNAL_SERVER_ERROR, &body, 500, None);
    assert_eq!(body["error"]["code"], "generation_failed");
    // The client gets the request id to quote; the details are in the server's log.
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("request id {id}")), "{message}");
    let (status, body) = post(&s.url("/v1/chat/completions"), &chat(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
}

#[tokio::test]
async fn full_queue_is_429_with_retry_after() {
    let s = fake_server(None, 64, 0);
    let resp = reqwest::Client::new()
        .post(s.url("/v1/completions"))
        .json(&json!({"model": "fake", "prompt": "Hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("retry-after").is_some());
    let body: Value = resp.json().await.unwrap();
    assert_error(reqwest::StatusCode::TOO_MANY_REQUESTS, &body, 429, None);
}

#[tokio::test]
async fn shutting_down_is_503() {
    let s = fake_server(None, 64, 16);
    s.state.scheduler.shutdown();
    let resp = reqwest::Client::new()
        .post(s.url("/v1/chat/completions"))
        .json(&chat(json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().get("retry-after").is_some());
}

#[tokio::test]
async fn request_larger_than_kv_cache_is_400() {
    // 2 blocks of 16 tokens: 32 tokens in all, under the 1024-token context.
    let s = fake_server(None, 2, 16);
    let (status, body) = post(
        &s.url("/v1/chat/completions"),
        &chat(json!({"max_tokens": 100})),
    )
    .await;
    assert_error(status, &body, 400, Some("max_tokens"));
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("KV cache"), "{message}");
    // The operator is told which flags raise the limits.
    assert!(
        message.contains("--max-model-len") && message.contains("--kv-cache-memory-mib"),
        "{message}"
    );
}

#[tokio::test]
async fn fake_generation_streams_n_choices_and_usage() {
    let s = fake_server(None, 64, 16);
    let (status, events) = post_sse(
        &s.url("/v1/completions"),
        &json!({"model": "fake", "prompt": "Hi", "max_tokens": 3, "n": 2, "stream": true,
                "stream_options": {"include_usage": true}, "echo": true}),
    )
    .await;
    assert_eq!(status, 200);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    for i in 0..2 {
        let t: String = chunks
            .iter()
            .filter(|c| {
                c["choices"].as_array().is_some_and(|a| !a.is_empty())
                    && c["choices"][0]["index"] == i
            })
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(t, "Hi hello hello hello");
    }
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 6);
}

/// `--served-model-name` with several names (as vLLM takes them): a request may send
/// any, replies report the first, `/v1/models` lists them all, and a 404 names them.
#[tokio::test]
async fn several_served_names_are_accepted_and_a_404_names_them() {
    use std::sync::Arc;

    use crate::api::models::ServedNames;

    let executor = FakeExecutor {
        token: hello_token(),
        fail_at: None,
        fail_from: None,
        panic_at: None,
        step_delay: None,
        steps: 0,
        kv: tessera_protocol::KvCacheShape::new(64, 16),
    };
    let mut state = fake_state(executor, 64, 1024, 16);
    let mut ctx = (*state.validation).clone();
    ctx.served_model_names = ServedNames::new(&["primary".into(), "alias".into()], "x".into());
    state.validation = Arc::new(ctx);
    let s = start(state, &[]);
    let (status, body) = post(
        &s.url("/v1/chat/completions"),
        &chat(json!({"model": "alias"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "primary");
    let (_, models) = get(&s.url("/v1/models")).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["primary", "alias"]);
    let (status, body) = get(&s.url("/v1/models/alias")).await;
    assert_eq!((status.as_u16(), &body["id"]), (200, &json!("alias")));
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let (status, body) = post(
            &s.url(path),
            &json!({"model": "gpt-17", "prompt": "x",
                    "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
        assert_error(status, &body, 404, Some("model"));
        assert_eq!(
            body["error"]["message"],
            "the model `gpt-17` does not exist; this server serves `primary` (also `alias`)"
        );
    }
    let (status, body) = get(&s.url("/v1/models/gpt-17")).await;
    assert_error(status, &body, 404, Some("model"));
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`primary` (also `alias`)"));
}
