//! vLLM's `structured_outputs` (and its older `guided_*` fields) against the real
//! `tessera serve` and the default model: every answer is one of the choices, matches
//! the regex, or parses under the grammar, greedy, sampled and streamed, on both routes;
//! bad constraints are refused with a 400 naming the field.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

fn chat(question: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 40,
        "temperature": 0
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Each choice's text and finish reason: the message (chat) or text (completions).
fn choices(out: &Value) -> Vec<(String, String)> {
    out["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = c["message"]["content"].as_str().or(c["text"].as_str());
            (
                text.unwrap_or_default().to_string(),
                c["finish_reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A constraint as the request sends it, and what every answer must satisfy.
struct Case {
    name: &'static str,
    fields: Value,
    check: fn(&str) -> bool,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "choice",
            fields: json!({"structured_outputs": {"choice": ["Paris", "London", "Rome (Italy)"]}}),
            check: |t| ["Paris", "London", "Rome (Italy)"].contains(&t),
        },
        Case {
            name: "guided_choice",
            fields: json!({"guided_choice": ["yes", "no"]}),
            check: |t| t == "yes" || t == "no",
        },
        Case {
            name: "regex",
            fields: json!({"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}}),
            check: |t| {
                t.len() == 8
                    && t.bytes().enumerate().all(|(i, b)| {
                        if i == 3 {
                            b == b'-'
                        } else {
                            b.is_ascii_digit()
                        }
                    })
            },
        },
        Case {
            name: "guided_regex",
            fields: json!({"guided_regex": "(red|green|blue), (red|green|blue)"}),
            check: |t| {
                let colours = ["red", "green", "blue"];
                t.split_once(", ")
                    .is_some_and(|(a, b)| colours.contains(&a) && colours.contains(&b))
            },
        },
        Case {
            name: "grammar",
            fields: json!({"structured_outputs": {"grammar":
                "start: item | item \" and \" item\nitem: \"cat\" | \"dog\" | \"bird\""}}),
            check: |t| {
                let words: Vec<&str> = t.split(" and ").collect();
                words.len() <= 2 && words.iter().all(|w| ["cat", "dog", "bird"].contains(w))
            },
        },
        Case {
            name: "json",
            fields: json!({"structured_outputs": {"json": {
                "type": "object", "additionalProperties": false, "required": ["n"],
                "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}}}}),
            check: |t| {
                serde_json::from_str::<Value>(t).is_ok_and(|v| {
                    v.as_object().is_some_and(|o| o.len() == 1)
                        && v["n"].as_i64().is_some_and(|n| (1..=9).contains(&n))
                })
            },
        },
    ]
}

fn start() -> common::Started {
    common::start_serve(&[], &["--max-num-seqs", "32"], &[])
}

#[tokio::test(flavor = "multi_thread")]
async fn every_answer_follows_its_constraint_greedy_sampled_and_streamed() {
    let started = start();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let chat_url = format!("{}/v1/chat/completions", started.base);
    let text_url = format!("{}/v1/completions", started.base);
    let runs = cases().into_iter().map(|case| {
        let (client, chat_url, text_url) = (client.clone(), chat_url.clone(), text_url.clone());
        async move {
            let question = "Answer with a short value.";
            let greedy = chat(question, case.fields.clone());
            let mut sampled = chat(question, case.fields.clone());
            sampled["n"] = json!(3);
            sampled["temperature"] = json!(1.2);
            sampled["seed"] = json!(11);
            let mut streamed = greedy.clone();
            streamed["stream"] = json!(true);
            let mut text = case.fields.clone();
            text["model"] = json!("smollm2");
            text["prompt"] = json!("The answer is: ");
            text["max_tokens"] = json!(40);
            text["temperature"] = json!(0);
            let (g, s, st, t) = tokio::join!(
                common::post_json(&client, &chat_url, &greedy),
                common::post_json(&client, &chat_url, &sampled),
                common::post_stream(&client, &chat_url, &streamed),
                common::post_json(&client, &text_url, &text)
            );
            (case, g, s, st, t)
        }
    });
    for (case, (s1, greedy), (s2, sampled), streams, (s3, text)) in join_all(runs).await {
        assert_eq!(streams.len(), 1);
        let streamed = streams[0].clone();
        let name = case.name;
        for (status, out) in [(s1, &greedy), (s2, &sampled), (s3, &text)] {
            assert_eq!(status, 200, "{name}: {out}");
        }
        let mut answers = choices(&greedy);
        assert_eq!(choices(&sampled).len(), 3, "{name}: {sampled}");
        answers.extend(choices(&sampled));
        answers.extend(choices(&text));
        answers.push(streamed.clone());
        for (answer, reason) in &answers {
            assert_eq!(reason, "stop", "{name}: {answer:?} did not end on its own");
            assert!(
                (case.check)(answer),
                "{name}: {answer:?} breaks the constraint"
            );
        }
        assert_eq!(
            streamed.0,
            choices(&greedy)[0].0,
            "{name}: the stream differs from the greedy answer"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_constraints_are_refused_with_a_400_naming_the_field() {
    let started = start();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let url = format!("{}/v1/chat/completions", started.base);
    let cases = [
        (
            json!({"structured_outputs": {"regex": "(unclosed"}}),
            "structured_outputs",
            "unclosed group",
        ),
        (
            json!({"guided_regex": "a{2,1}"}),
            "guided_regex",
            "invalid repetition count",
        ),
        (
            json!({"structured_outputs": {"grammar": "start: missing"}}),
            "structured_outputs",
            "missing",
        ),
        (
            json!({"guided_grammar": "root ::= \"a\""}),
            "guided_grammar",
            "Lark",
        ),
        (
            json!({"structured_outputs": {"json": {"type": "array", "uniqueItems": true}}}),
            "structured_outputs",
            "uniqueItems",
        ),
        (
            json!({"structured_outputs": {"choice": []}}),
            "structured_outputs.choice",
            "non-empty",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
            "structured_outputs",
            "one constraint",
        ),
        (
            json!({"structured_outputs": {"regex": "a"},
                   "response_format": {"type": "json_object"}}),
            "structured_outputs",
            "response_format",
        ),
        (
            json!({"guided_choice": ["a"], "ignore_eos": true}),
            "ignore_eos",
            "guided_choice",
        ),
        (
            json!({"guided_choice": ["a"], "tool_choice": "required", "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
            "tool_choice",
            "guided_choice",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "structural_tag": "{}"}}),
            "structured_outputs.structural_tag",
            "not supported",
        ),
    ];
    for (fields, param, needle) in cases {
        let (status, out) = common::post_json(&client, &url, &chat("Hi", fields.clone())).await;
        assert_eq!(status, 400, "{fields}: {out}");
        assert_eq!(out["error"]["type"], "invalid_request_error", "{out}");
        assert_eq!(out["error"]["param"], param, "{fields}: {out}");
        let message = out["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message} should name {needle}");
    }
}
