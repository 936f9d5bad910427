//! The OpenAPI document stays true: every route of the router is in it, and real
//! responses carry the required fields (and types) its schemas declare.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::openapi::{document, document_for};
use crate::serve::routes::routes;

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.trim_start_matches("#/components/schemas/");
            &doc["components"]["schemas"][name]
        }
        None => schema,
    }
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => true,
    }
}

/// Structural check: types, `const`, required fields, recursively.
fn check(doc: &Value, schema: &Value, v: &Value, path: &str) {
    let schema = resolve(doc, schema);
    if let Some(t) = schema.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).any(|t| type_ok(t, v)),
            _ => true,
        };
        assert!(ok, "{path}: {v} is not of type {t}");
    }
    if v.is_null() {
        return;
    }
    if let Some(c) = schema.get("const") {
        assert_eq!(v, c, "{path}");
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        assert!(values.contains(v), "{path}: {v} not in {values:?}");
    }
    if let Some(obj) = v.as_object() {
        for r in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap();
            assert!(obj.contains_key(r), "{path}: missing required `{r}` in {v}");
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (k, s) in props {
                if let Some(child) = obj.get(k) {
                    check(doc, s, child, &format!("{path}.{k}"));
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            check(doc, items, item, &format!("{path}[{i}]"));
        }
    }
}

/// The chunk schema of a completion route's event stream: each event an object whose
/// `data` is `[DONE]` or JSON text of a chunk or an error envelope.
fn stream_chunk_schema<'a>(doc: &'a Value, path: &str) -> &'a Value {
    let event = response_schema(doc, path, "post", "200", "text/event-stream");
    assert_eq!(event["required"], json!(["data"]));
    let data = &event["properties"]["data"]["anyOf"];
    assert_eq!(data[0], json!({"const": "[DONE]"}));
    assert_eq!(data[1]["contentMediaType"], "application/json");
    let schema = &data[1]["contentSchema"]["anyOf"][0];
    assert!(schema["$ref"].is_string(), "{event}");
    schema
}

fn response_schema<'a>(
    doc: &'a Value,
    path: &str,
    method: &str,
    status: &str,
    media: &str,
) -> &'a Value {
    let s = &doc["paths"][path][method]["responses"][status]["content"][media]["schema"];
    assert!(
        !s.is_null(),
        "no {status} {media} schema for {method} {path}"
    );
    s
}

#[test]
fn every_route_is_documented() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let routes = routes();
    for route in &routes {
        let method = route.method.as_str().to_ascii_lowercase();
        assert!(
            doc["paths"][route.path][&method].is_object(),
            "{} {} is missing from openapi.json",
            route.method,
            route.path
        );
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().len())
        .sum();
    assert_eq!(
        documented,
        routes.len(),
        "the document has routes the router lacks"
    );
}

#[tokio::test]
async fn real_responses_validate_against_the_document() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (status, doc) = get(&s.url("/openapi.json")).await;
    assert_eq!(status, 200);
    assert_eq!(doc, document_for("smollm2"));
    let j = "application/json";

    let (_, chat) = post(
        &s.url("/v1/chat/completions"),
        &france(json!({"max_tokens": 2, "logprobs": true, "top_logprobs": 1})),
    )
    .await;
    check(
        &doc,
        response_schema(&doc, "/v1/chat/completions", "post", "200", j),
        &chat,
        "chat",
    );
    let (_, events) = post_sse(
        &s.url("/v1/chat/completions"),
        &france(
            json!({"max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    let chunk_schema = stream_chunk_schema(&doc, "/v1/chat/completions");
    for e in events.iter().filter(|e| *e != "[DONE]") {
        check(
            &doc,
            chunk_schema,
            &serde_json::from_str(e).unwrap(),
            "chat chunk",
        );
    }
    let (_, cmpl) = post(
        &s.url("/v1/completions"),
        &json!({"model": "smollm2", "prompt": "Hi", "max_tokens": 2, "logprobs": 1}),
    )
    .await;
    check(
        &doc,
        response_schema(&doc, "/v1/completions", "post", "200", j),
        &cmpl,
        "completion",
    );
    let (_, events) = post_sse(
        &s.url("/v1/completions"),
        &json!({"model": "smollm2", "prompt": "Hi", "max_tokens": 2, "stream": true}),
    )
    .await;
    let chunk_schema = stream_chunk_schema(&doc, "/v1/completions");
    for e in events.iter().filter(|e| *e != "[DONE]") {
        check(
            &doc,
            chunk_schema,
            &serde_json::from_str(e).unwrap(),
            "completion chunk",
        );
    }
    let (_, models) = get(&s.url("/v1/models")).await;
    check(
        &doc,
        response_schema(&doc, "/v1/models", "get", "200", j),
        &models,
        "models",
    );
    let (_, model) = get(&s.url("/v1/models/smollm2")).await;
    check(
        &doc,
        response_schema(&doc, "/v1/models/{id}", "get", "200", j),
        &model,
        "model",
    );
    let (_, tok) = post(&s.url("/tokenize"), &json!({"prompt": "Hi"})).await;
    check(
        &doc,
        response_schema(&doc, "/tokenize", "post", "200", j),
        &tok,
        "tokenize",
    );
    let (_, detok) = post(&s.url("/detokenize"), &json!({"tokens": tok["tokens"]})).await;
    check(
        &doc,
        response_schema(&doc, "/detokenize", "post", "200", j),
        &detok,
        "detokenize",
    );
    let (_, health) = get(&s.url("/health")).await;
    check(
        &doc,
        response_schema(&doc, "/health", "get", "200", j),
        &health,
        "health",
    );
    let (_, err) = post(
        &s.url("/v1/chat/completions"),
        &france(json!({"temperature": 9})),
    )
    .await;
    check(
        &doc,
        response_schema(&doc, "/v1/chat/completions", "post", "default", j),
        &err,
        "error",
    );
}
