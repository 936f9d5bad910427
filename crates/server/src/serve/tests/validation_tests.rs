//! Refusals (each a 400 naming the parameter, or the right status), auth, CORS, the
//! info routes and tokenize/detokenize. None of these generate more than one token.

use std::sync::Arc;

use serde_json::{json, Value};

use super::harness::*;
use crate::api::valid_request::ValidationContext;

async fn chat_error(extra: Value, param: &str) {
    let s = model_server();
    let (status, body) = post(&s.url("/v1/chat/completions"), &france(extra.clone())).await;
    assert_error(status, &body, 400, Some(param));
    let _ = extra;
}

#[tokio::test]
async fn chat_parameters_out_of_range_are_refused_by_name() {
    let _gate = SCHEDULER_GATE.read().await;
    for (extra, param) in [
        (json!({"temperature": 5}), "temperature"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"top_k": -5}), "top_k"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"n": 0}), "n"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_completion_tokens": 0}), "max_completion_tokens"),
        (json!({"max_tokens": 100000}), "max_tokens"),
        (json!({"logit_bias": {"999999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 500}}), "logit_bias"),
        (json!({"stop": [""]}), "stop"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"reasoning_effort": "low"}), "reasoning_effort"),
        (json!({"verbosity": "low"}), "verbosity"),
        (json!({"store": true}), "store"),
        (
            json!({"logprobs": true, "top_logprobs": 50}),
            "top_logprobs",
        ),
        (
            json!({"stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"description": "f"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
                   "parameters": {"type": "object", "properties": {"a": {"type": 7}}}}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "auto"}), "tool_choice"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
        ),
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema",
                   "json_schema": {"name": "t", "schema": {"type": "fish"}}}}),
            "response_format",
        ),
        (
            json!({"ignore_eos": true, "response_format": {"type": "json_object"}}),
            "ignore_eos",
        ),
        (json!({"best_of": 3}), "best_of"),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "critic", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "f", "arguments": "{not json"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
        ),
    ] {
        chat_error(extra, param).await;
    }
    let (_, body) = post(
        &model_server().url("/v1/chat/completions"),
        &france(
            json!({"response_format": {"type": "json_schema", "json_schema":
            {"name": "t", "schema": {"type": "array", "uniqueItems": true}}}}),
        ),
    )
    .await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`uniqueItems`"));
}

#[tokio::test]
async fn text_parts_are_accepted() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let body = france(json!({
        "messages": [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hi."}]}
        ],
        "max_tokens": 1
    }));
    let (status, out) = post(&s.url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test]
async fn completion_parameters_are_refused_by_name() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let url = s.url("/v1/completions");
    let base = json!({"model": "smollm2", "prompt": "Hi", "max_tokens": 1});
    for (extra, param) in [
        (json!({"suffix": "end"}), "suffix"),
        (json!({"prompt": [999999]}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": ""}), "prompt"),
        (json!({"prompt": {"a": 1}}), "prompt"),
        (json!({"logprobs": 21}), "logprobs"),
        (json!({"best_of": 2}), "best_of"),
        // A character whose UTF-8 bytes include one SmolLM2's vocabulary has no token for.
        (json!({"prompt": "a \u{9F600} b"}), "prompt"),
    ] {
        let mut body = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, out) = post(&url, &body).await;
        assert_error(status, &out, 400, Some(param));
    }
}

#[tokio::test]
async fn bad_bodies_get_json_errors() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let client = reqwest::Client::new();
    let url = s.url("/v1/chat/completions");
    let send = |body: &'static str, ct: Option<&'static str>| {
        let mut req = client.post(&url).body(body);
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = send("{not json", Some("application/json")).await;
    assert_error(status, &body, 400, None);
    let (status, body) = send("[1, 2]", Some("application/json")).await;
    assert_error(status, &body, 400, None);
    let (status, body) = send("{}", Some("text/plain")).await;
    assert_error(status, &body, 415, None);
    let (status, body) = send("{}", None).await;
    assert_error(status, &body, 415, None);
    let (status, body) = send(r#"{"messages": []}"#, Some("application/json")).await;
    assert_error(status, &body, 400, Some("model"));
    let (status, body) = post(&url, &france(json!({"model": "gpt-17"}))).await;
    assert_error(status, &body, 404, Some("model"));
    assert_eq!(body["error"]["code"], "model_not_found");
    let (status, body) = post(
        &s.url("/v1/completions"),
        &json!({"model": "nope", "prompt": "x"}),
    )
    .await;
    assert_error(status, &body, 404, Some("model"));
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let s = model_server();
    let (status, body) = get(&s.url("/v1/nothing")).await;
    assert_error(status, &body, 404, None);
    let (status, body) = get(&s.url("/v1/chat/completions")).await;
    assert_error(status, &body, 405, None);
}

#[tokio::test]
async fn oversized_body_is_413() {
    let mut state = model_state().clone();
    state.max_body_bytes = 1024;
    let s = start(state, &[]);
    let big = "x".repeat(4096);
    let (status, body) = post(
        &s.url("/v1/completions"),
        &json!({"model": "smollm2", "prompt": big}),
    )
    .await;
    assert_error(status, &body, 413, None);
}

#[tokio::test]
async fn prompt_longer_than_context_names_both_lengths() {
    let _gate = SCHEDULER_GATE.read().await;
    let mut state = model_state().clone();
    let v = &state.validation;
    state.validation = Arc::new(ValidationContext {
        max_model_len: 8,
        ..ValidationContext::clone(v)
    });
    let s = start(state, &[]);
    let (status, body) = post(
        &s.url("/v1/completions"),
        &json!({"model": "smollm2", "prompt": "one two three four five six seven eight nine ten", "max_tokens": 1}),
    )
    .await;
    assert_error(status, &body, 400, Some("prompt"));
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("10 tokens") && msg.contains("8 tokens"),
        "{msg}"
    );
}

#[tokio::test]
async fn api_keys_guard_everything_but_health() {
    let mut state = model_state().clone();
    state.api_keys = Arc::new(vec!["k-one".into(), "k-two".into()]);
    let s = start(state, &[]);
    let client = reqwest::Client::new();
    let r = client.get(s.url("/v1/models")).send().await.unwrap();
    let status = r.status();
    assert_error(status, &r.json().await.unwrap(), 401, None);
    let r = client
        .get(s.url("/v1/models"))
        .bearer_auth("k-three")
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_error(status, &body, 401, None);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    assert!(!body.to_string().contains("k-one"));
    let r = client
        .get(s.url("/v1/models"))
        .bearer_auth("k-two")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn cors_headers_only_with_allowed_origins() {
    let origin = "http://example.test";
    let plain = model_server();
    let r = reqwest::Client::new()
        .get(plain.url("/v1/models"))
        .header("origin", origin)
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let s = start(model_state().clone(), &[origin.to_string()]);
    let r = reqwest::Client::new()
        .get(s.url("/v1/models"))
        .header("origin", origin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["access-control-allow-origin"], origin);
    let r = reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert_eq!(r.headers()["access-control-allow-origin"], origin);
}

#[tokio::test]
async fn models_health_metrics_tokenize_detokenize() {
    let s = model_server();
    let (status, list) = get(&s.url("/v1/models")).await;
    assert_eq!(status, 200);
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"][0]["id"], "smollm2");
    assert_eq!(list["data"][0]["max_model_len"], 2048);
    let (status, card) = get(&s.url("/v1/models/smollm2")).await;
    assert_eq!(status, 200);
    assert_eq!(card["object"], "model");
    let (status, body) = get(&s.url("/v1/models/other")).await;
    assert_error(status, &body, 404, Some("model"));
    let (status, health) = get(&s.url("/health")).await;
    assert_eq!((status.as_u16(), health), (200, json!({"status": "ok"})));
    let (status, metrics) = get(&s.url("/metrics")).await;
    assert_eq!(status, 200);
    assert!(metrics
        .as_str()
        .unwrap()
        .contains("tessera_kv_blocks_in_use "));

    let (status, tok) = post(
        &s.url("/tokenize"),
        &json!({"model": "smollm2", "prompt": "Hello world", "return_token_strs": true}),
    )
    .await;
    assert_eq!(status, 200, "{tok}");
    assert_eq!(
        tok["count"].as_u64().unwrap() as usize,
        tok["tokens"].as_array().unwrap().len()
    );
    assert_eq!(tok["max_model_len"], 2048);
    assert_eq!(
        tok["token_strs"].as_array().unwrap().len(),
        tok["tokens"].as_array().unwrap().len()
    );
    let (status, detok) = post(&s.url("/detokenize"), &json!({"tokens": tok["tokens"]})).await;
    assert_eq!(status, 200);
    assert_eq!(detok["prompt"], "Hello world");
    let (status, chat) = post(
        &s.url("/tokenize"),
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(chat["count"].as_u64().unwrap() > tok["count"].as_u64().unwrap());
    let (status, body) = post(&s.url("/tokenize"), &json!({})).await;
    assert_error(status, &body, 400, Some("prompt"));
    let (status, body) = post(&s.url("/detokenize"), &json!({"tokens": [99999999]})).await;
    assert_error(status, &body, 400, Some("tokens"));
    let (status, body) = post(&s.url("/detokenize"), &json!({"tokens": "x"})).await;
    assert_error(status, &body, 400, Some("tokens"));
    let (status, body) = post(&s.url("/tokenize"), &json!({"model": "x", "prompt": "a"})).await;
    assert_error(status, &body, 404, Some("model"));
}

#[tokio::test]
async fn model_names_from_requests_are_compared_never_opened() {
    let s = model_server();
    for name in ["/etc/passwd", "../../models/other.gguf", "smollm2/../x"] {
        let (status, body) = post(
            &s.url("/v1/completions"),
            &json!({"model": name, "prompt": "Hi", "max_tokens": 1}),
        )
        .await;
        assert_error(status, &body, 404, Some("model"));
        assert_eq!(body["error"]["code"], "model_not_found");
        assert!(!body.to_string().contains(".cache"), "{body}");
    }
    let (status, body) = get(&s.url("/v1/models/%2Fetc%2Fpasswd")).await;
    assert_error(status, &body, 404, Some("model"));
}

/// Token ids must have a row in the model's embedding, not only in the tokenizer: ids
/// past it are a 400 at validation (they would fail in the engine), whether sent as ids
/// or produced by tokenizing text, and `logit_bias` keys are held to the same bound.
#[tokio::test]
async fn token_ids_past_the_embedding_are_refused() {
    let hello = hello_token();
    let mut state = fake_server(None, 64, 16).state;
    state.validation = Arc::new(ValidationContext {
        vocab_rows: hello as usize,
        ..ValidationContext::clone(&state.validation)
    });
    let s = start(state, &[]);
    let bound = format!("is out of range (vocabulary size {hello})");
    let cases = [
        (
            "/v1/completions",
            json!({"model": "fake", "prompt": [1, hello], "max_tokens": 1}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": "fake", "prompt": "Say hello", "max_tokens": 1}),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "fake", "messages": [{"role": "user", "content": "Say hello"}]}),
            "messages",
        ),
    ];
    for (path, body, param) in cases {
        let (status, reply) = post(&s.url(path), &body).await;
        assert_error(status, &reply, 400, Some(param));
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        // Text may hold other ids past the bound before " hello".
        assert!(
            message.starts_with("token id ") && message.ends_with(&bound),
            "{body}: {message}"
        );
    }
    let biased = json!({"model": "fake", "prompt": [1], "max_tokens": 1,
        "logit_bias": {hello.to_string(): 5}});
    let (status, reply) = post(&s.url("/v1/completions"), &biased).await;
    assert_error(status, &reply, 400, Some("logit_bias"));
    let ok = json!({"model": "fake", "prompt": [1, hello - 1], "max_tokens": 1});
    let (status, reply) = post(&s.url("/v1/completions"), &ok).await;
    assert_eq!(status, 200, "{reply}");
}
