//! The Messages API's (Anthropic's) errors where only a fake engine can make them: a full
//! queue (429 `rate_limit_error`), a failed step (500 `api_error`, and mid-stream an
//! `error` event), a draining server (529 `overloaded_error`); and the reply's shape
//! over the real model.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::harness::*;

fn message(extra: Value) -> Value {
    let mut body = json!({"model": "fake", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// Status and Anthropic error type of a reply.
async fn anthropic_error(url: &str, body: &Value) -> (StatusCode, String, Option<String>) {
    let resp = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    (
        status,
        body["error"]["type"].as_str().unwrap().to_string(),
        retry,
    )
}

#[tokio::test]
async fn a_full_queue_is_a_rate_limit_error() {
    let s = fake_server(None, 64, 0);
    let (status, kind, retry) = anthropic_error(&s.url("/v1/messages"), &message(json!({}))).await;
    assert_eq!((status.as_u16(), kind.as_str()), (429, "rate_limit_error"));
    assert_eq!(retry.as_deref(), Some("1"));
}

#[tokio::test]
async fn a_failed_step_is_an_api_error_and_mid_stream_an_error_event() {
    let s = fake_server(Some(1), 64, 16);
    let (status, kind, _) = anthropic_error(&s.url("/v1/messages"), &message(json!({}))).await;
    assert_eq!((status.as_u16(), kind.as_str()), (500, "api_error"));
    // Step 1 is the prefill; step 4 fails after a few tokens.
    let s = fake_server(Some(4), 64, 16);
    let resp = reqwest::Client::new()
        .post(s.url("/v1/messages"))
        .json(&message(json!({"stream": true, "max_tokens": 16})))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events: Vec<(&str, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("");
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or("null");
            (name, serde_json::from_str(data).unwrap())
        })
        .collect();
    assert_eq!(events[0].0, "message_start");
    let (i, error) = events
        .iter()
        .enumerate()
        .find(|(_, (name, _))| *name == "error")
        .map(|(i, (_, v))| (i, v.clone()))
        .unwrap_or_else(|| panic!("no error event: {text}"));
    assert!(i > 2, "the error came after some text: {text}");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(!text.contains("SECRET-INTERNAL-DETAIL"));
    // Every event is named after its data's type.
    for (name, data) in &events {
        assert_eq!(data["type"].as_str(), Some(*name), "{text}");
    }
}

#[tokio::test]
async fn a_draining_server_is_overloaded_with_529() {
    let s = fake_server(None, 64, 16);
    s.state.scheduler.close_admission();
    let (status, kind, retry) = anthropic_error(&s.url("/v1/messages"), &message(json!({}))).await;
    assert_eq!((status.as_u16(), kind.as_str()), (529, "overloaded_error"));
    assert_eq!(retry.as_deref(), Some("1"));
    // The OpenAI routes of the same server say 503 in their own envelope.
    let chat = json!({"model": "fake", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}]});
    let (status, body) = post(&s.url("/v1/chat/completions"), &chat).await;
    assert_error(status, &body, 503, None);
}

#[tokio::test]
async fn errors_before_the_route_are_in_anthropics_envelope_too() {
    let s = fake_server(None, 64, 16);
    for (body, want) in [("not json", 400), ("{\"model\": \"fake\"}", 400)] {
        let resp = reqwest::Client::new()
            .post(s.url("/v1/messages"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), want);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let resp = reqwest::Client::new()
        .post(s.url("/v1/messages"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn a_wrong_method_keeps_its_allow_header_in_anthropics_envelope() {
    let s = fake_server(None, 64, 16);
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let resp = reqwest::Client::new()
            .get(s.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 405, "{path}");
        assert_eq!(
            resp.headers().get("allow").map(|v| v.to_str().unwrap()),
            Some("POST"),
            "{path}"
        );
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
}
