//! `response_format` against the real `tessera serve` and the default model: every
//! answer under a JSON schema is JSON that a schema validator accepts, streamed or not,
//! with `n > 1`, under preemption; bad schemas are refused with a 400.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

/// Schemas covering nested objects, arrays with item limits, enums, required and
/// optional fields, bounded numbers and string patterns.
fn schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "person",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 20},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "email": {"type": "string", "maxLength": 30}
                },
                "required": ["name", "age"],
                "additionalProperties": false
            }),
        ),
        (
            "nested",
            json!({
                "type": "object",
                "properties": {
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 20},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": false
                    },
                    "owner": {
                        "type": "object",
                        "properties": {"first": {"type": "string", "maxLength": 15}},
                        "required": ["first"],
                        "additionalProperties": false
                    }
                },
                "required": ["address", "owner"],
                "additionalProperties": false
            }),
        ),
        (
            "fruits",
            json!({
                "type": "object",
                "properties": {
                    "fruits": {
                        "type": "array",
                        "items": {"type": "string", "maxLength": 12},
                        "minItems": 2,
                        "maxItems": 4
                    }
                },
                "required": ["fruits"],
                "additionalProperties": false
            }),
        ),
        (
            "enums",
            json!({
                "type": "object",
                "properties": {
                    "color": {"enum": ["red", "green", "blue"]},
                    "size": {"type": "string", "enum": ["S", "M", "L"]}
                },
                "required": ["color", "size"],
                "additionalProperties": false
            }),
        ),
        (
            "numbers",
            json!({
                "type": "object",
                "properties": {
                    "temperature": {"type": "number", "minimum": -10.5, "maximum": 40},
                    "count": {"type": "integer", "minimum": 3, "maximum": 7}
                },
                "required": ["temperature", "count"],
                "additionalProperties": false
            }),
        ),
        (
            "patterns",
            json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                    "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}
                },
                "required": ["code", "date"],
                "additionalProperties": false
            }),
        ),
        (
            "items",
            json!({
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 1, "maximum": 99},
                        "ok": {"type": "boolean"}
                    },
                    "required": ["id", "ok"],
                    "additionalProperties": false
                },
                "minItems": 1,
                "maxItems": 3
            }),
        ),
    ]
}

fn chat(name: &str, schema: &Value, extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": "You answer in JSON."},
            {"role": "user", "content": format!("Give me an example `{name}` record.")}
        ],
        "max_tokens": 200,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": true}
        }
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Fails unless `text` is JSON valid under `schema` and generation stopped on its own.
fn assert_valid(what: &str, schema: &Value, text: &str, finish_reason: &str) {
    assert_eq!(finish_reason, "stop", "{what}: {text}");
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"));
    let validator = jsonschema::validator_for(schema).expect("test schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{what}: {text} violates the schema: {errors:?}"
    );
}

fn start() -> common::Started {
    common::start_serve(&[], &["--max-num-seqs", "32"], &[])
}

#[tokio::test(flavor = "multi_thread")]
async fn every_schema_gives_valid_json_greedy_sampled_and_streamed() {
    let started = start();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let url = format!("{}/v1/chat/completions", started.base);
    let runs = schemas().into_iter().map(|(name, schema)| {
        let client = client.clone();
        let url = url.clone();
        async move {
            let greedy = chat(name, &schema, json!({}));
            let sampled = chat(
                name,
                &schema,
                json!({"n": 2, "temperature": 1.0, "seed": 7}),
            );
            let streamed = chat(name, &schema, json!({"stream": true}));
            let (a, b, c) = tokio::join!(
                common::post_json(&client, &url, &greedy),
                common::post_json(&client, &url, &sampled),
                common::post_stream(&client, &url, &streamed)
            );
            (name, schema, a, b, c)
        }
    });
    for (name, schema, (s1, greedy), (s2, sampled), streamed) in join_all(runs).await {
        assert_eq!(s1, 200, "{name}: {greedy}");
        assert_eq!(s2, 200, "{name}: {sampled}");
        let text = greedy["choices"][0]["message"]["content"].as_str().unwrap();
        let reason = greedy["choices"][0]["finish_reason"].as_str().unwrap();
        assert_valid(&format!("{name} greedy"), &schema, text, reason);
        let choices = sampled["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2);
        for (i, c) in choices.iter().enumerate() {
            assert_valid(
                &format!("{name} sampled choice {i}"),
                &schema,
                c["message"]["content"].as_str().unwrap(),
                c["finish_reason"].as_str().unwrap(),
            );
        }
        assert_eq!(streamed.len(), 1);
        assert_valid(
            &format!("{name} streamed"),
            &schema,
            &streamed[0].0,
            &streamed[0].1,
        );
        assert_eq!(
            streamed[0].0, text,
            "{name}: the stream differs from the greedy answer"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_object_on_both_routes_logprobs_and_length() {
    let started = start();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let object = json!({"type": "object"});
    let (status, out) = common::post_json(
        &client,
        &format!("{}/v1/completions", started.base),
        &json!({
            "model": "smollm2",
            "prompt": "A cat, described as a JSON object:\n",
            "max_tokens": 150,
            "temperature": 0,
            "response_format": {"type": "json_object"}
        }),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let c = &out["choices"][0];
    assert_valid(
        "completions json_object",
        &object,
        c["text"].as_str().unwrap(),
        c["finish_reason"].as_str().unwrap(),
    );

    let streamed = common::post_stream(
        &client,
        &format!("{}/v1/completions", started.base),
        &json!({
            "model": "smollm2",
            "prompt": "A dog, described as a JSON object:\n",
            "max_tokens": 150,
            "temperature": 0,
            "stream": true,
            "response_format": {"type": "json_object"}
        }),
    )
    .await;
    assert_valid(
        "streamed completions json_object",
        &object,
        &streamed[0].0,
        &streamed[0].1,
    );

    // Log-probabilities are those of the masked distribution: every alternative offered
    // is a token the grammar allowed, so the first token's alternatives all start `{`.
    let chat_url = format!("{}/v1/chat/completions", started.base);
    let (status, out) = common::post_json(
        &client,
        &chat_url,
        &json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Describe a car."}],
            "max_tokens": 150,
            "temperature": 0,
            "logprobs": true,
            "top_logprobs": 5,
            "response_format": {"type": "json_object"}
        }),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let c = &out["choices"][0];
    assert_valid(
        "chat json_object",
        &object,
        c["message"]["content"].as_str().unwrap(),
        c["finish_reason"].as_str().unwrap(),
    );
    let first = &c["logprobs"]["content"][0];
    let alternatives = first["top_logprobs"].as_array().unwrap();
    assert!(!alternatives.is_empty());
    for alt in alternatives {
        assert!(
            alt["token"].as_str().unwrap().trim_start().starts_with('{'),
            "the grammar allows only `{{` first, got {alt}"
        );
        assert!(alt["logprob"].as_f64().unwrap() <= 0.0);
    }
    let total: f64 = alternatives
        .iter()
        .map(|a| a["logprob"].as_f64().unwrap().exp())
        .sum();
    assert!(
        total <= 1.0 + 1e-4,
        "alternatives' probabilities sum to {total}"
    );

    // max_tokens first: the JSON is cut and the reason is "length".
    let (name, schema) = &schemas()[0];
    let (status, out) = common::post_json(
        &client,
        &chat_url,
        &chat(name, schema, json!({"max_tokens": 3})),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["choices"][0]["finish_reason"], "length");
    assert_eq!(out["usage"]["completion_tokens"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_schemas_are_refused_with_a_400_naming_the_problem() {
    let started = start();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let url = format!("{}/v1/chat/completions", started.base);
    let with_format = |format: Value| {
        json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": format
        })
    };
    let schema = |schema: Value| {
        with_format(json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}))
    };
    let cases = [
        (
            schema(json!({"type": "array", "uniqueItems": true})),
            "uniqueItems",
        ),
        (schema(json!({"type": "fish"})), "invalid JSON schema"),
        (
            schema(json!({"type": "object", "properties": 5})),
            "invalid JSON schema",
        ),
        (
            with_format(json!({"type": "json_schema", "json_schema": {"schema": {}}})),
            "name",
        ),
        (with_format(json!({"type": "yaml"})), "yaml"),
    ];
    for (body, needle) in cases {
        let (status, out) = common::post_json(&client, &url, &body).await;
        assert_eq!(status, 400, "{body}: {out}");
        assert_eq!(out["error"]["type"], "invalid_request_error", "{out}");
        assert_eq!(out["error"]["param"], "response_format", "{out}");
        let message = out["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message} should name {needle}");
    }
    // Same refusal on /v1/completions.
    let (status, out) = common::post_json(
        &client,
        &format!("{}/v1/completions", started.base),
        &json!({"model": "smollm2", "prompt": "Hi", "response_format":
                {"type": "json_schema", "json_schema": {"name": "t", "schema": {"not": {}}}}}),
    )
    .await;
    assert_eq!(status, 400, "{out}");
    assert!(out["error"]["message"].as_str().unwrap().contains("not"));
}

#[tokio::test(flavor = "multi_thread")]
async fn constrained_sequences_survive_preemption() {
    // A KV cache of 256 tokens, too small for eight requests at once: sequences are
    // preempted and recomputed, and their grammar state must carry over.
    let started = common::start(
        &[
            "serve",
            "--port",
            "0",
            "--served-model-name",
            "smollm2",
            "--threads-per-rank",
            "1",
            "--kv-cache-memory-mib",
            "12",
            "--max-num-seqs",
            "16",
        ],
        &[],
    );
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let url = format!("{}/v1/chat/completions", started.base);
    let all = schemas();
    let runs = (0..8).map(|i| {
        let (name, schema) = all[i % all.len()].clone();
        let client = client.clone();
        let url = url.clone();
        async move {
            let body = chat(name, &schema, json!({"temperature": 0.9, "seed": i}));
            (name, schema, common::post_json(&client, &url, &body).await)
        }
    });
    for (name, schema, (status, out)) in join_all(runs).await {
        assert_eq!(status, 200, "{name}: {out}");
        let c = &out["choices"][0];
        assert_valid(
            &format!("{name} under preemption"),
            &schema,
            c["message"]["content"].as_str().unwrap(),
            c["finish_reason"].as_str().unwrap(),
        );
    }
    let metrics = client
        .get(format!("{}/metrics", started.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let preemptions: f64 = metrics
        .lines()
        .find(|l| l.starts_with("vllm:num_preemptions_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .expect("preemption counter");
    assert!(
        preemptions > 0.0,
        "no sequence was preempted; shrink the cache"
    );
}
