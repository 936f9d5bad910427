//! Tool calling over the real model: forced calls (`required`, named) whose arguments
//! validate against the tool's schema, streamed deltas that assemble to the same call,
//! `parallel_tool_calls`, a tool-result round trip, and `auto` on a reply without calls.

use serde_json::{json, Value};

use super::harness::*;

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city", "unit"],
            "additionalProperties": false
        }
    }})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 12}},
            "required": ["zone"],
            "additionalProperties": false
        }
    }})
}

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [weather_tool(), time_tool()],
        "temperature": 0,
        "max_tokens": 80
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn schema_of(name: &str) -> Value {
    [weather_tool(), time_tool()]
        .into_iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap()["function"]["parameters"]
        .clone()
}

/// Each call's id, name and arguments, the arguments checked against the tool schema.
fn checked_calls(message: &Value) -> Vec<(String, Value)> {
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    calls
        .iter()
        .map(|c| {
            assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
            assert_eq!(c["type"], "function");
            let name = c["function"]["name"].as_str().unwrap().to_string();
            let args: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
            let schema = schema_of(&name);
            assert!(
                jsonschema::is_valid(&schema, &args),
                "{args} does not follow {schema}"
            );
            (name, args)
        })
        .collect()
}

#[tokio::test]
async fn required_gives_calls_that_follow_the_schemas() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (status, body) = post(
        &s.url("/v1/chat/completions"),
        &ask(json!({"tool_choice": "required"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    assert!(choice["message"]["content"].is_null(), "{body}");
    assert!(!checked_calls(&choice["message"]).is_empty());
}

#[tokio::test]
async fn named_choice_calls_that_function_and_parallel_false_makes_one_call() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (status, body) = post(
        &s.url("/v1/chat/completions"),
        &ask(json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let calls = checked_calls(&body["choices"][0]["message"]);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "get_time");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");

    let (status, body) = post(
        &s.url("/v1/chat/completions"),
        &ask(
            json!({"tool_choice": "required", "parallel_tool_calls": false,
                    "temperature": 1.0, "seed": 7}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(checked_calls(&body["choices"][0]["message"]).len(), 1);
}

#[tokio::test]
async fn streamed_call_deltas_assemble_to_the_same_call() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let request = ask(json!({"tool_choice": "required"}));
    let (_, whole) = post(&s.url("/v1/chat/completions"), &request).await;
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, events) = post_sse(&s.url("/v1/chat/completions"), &streamed).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = None;
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let choice = &chunk["choices"][0];
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_string());
        }
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = d["index"].as_u64().unwrap() as usize;
            if let Some(id) = d["id"].as_str() {
                // The first delta of a call: id, type and name, before any arguments.
                assert_eq!(index, calls.len(), "{d}");
                assert_eq!(d["type"], "function");
                calls.push((
                    id.to_string(),
                    d["function"]["name"].as_str().unwrap().to_string(),
                    String::new(),
                ));
            } else {
                assert!(d["function"]["name"].is_null(), "{d}");
            }
            calls[index]
                .2
                .push_str(d["function"]["arguments"].as_str().unwrap_or_default());
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let expected = whole["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert_eq!(calls.len(), expected.len());
    for ((_, name, args), want) in calls.iter().zip(expected) {
        assert_eq!(name, want["function"]["name"].as_str().unwrap());
        assert_eq!(args, want["function"]["arguments"].as_str().unwrap());
    }
}

#[tokio::test]
async fn a_tool_result_round_trip_renders_and_continues() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let messages = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}
        }]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"}
    ]);
    let body = ask(json!({"messages": messages, "max_tokens": 24}));
    let (status, out) = post(&s.url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{out}");
    let choice = &out["choices"][0];
    assert!(
        choice["message"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
            || choice["message"]["tool_calls"].is_array(),
        "{out}"
    );
    // The prompt holds the call and its result in the Hermes form: the template knows
    // no tools, so the call is written into the assistant turn and the result into a
    // `<tool_response>` turn. /tokenize renders as the chat does.
    let (status, tok) = post(
        &s.url("/tokenize"),
        &json!({"messages": messages, "tools": [weather_tool(), time_tool()], "add_generation_prompt": true}),
    )
    .await;
    assert_eq!(status, 200, "{tok}");
    assert_eq!(tok["count"], out["usage"]["prompt_tokens"], "{tok} {out}");
    let (_, text) = post(&s.url("/detokenize"), &json!({"tokens": tok["tokens"]})).await;
    let prompt = text["prompt"].as_str().unwrap();
    let call = "<|im_start|>assistant\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"celsius\"}}\n</tool_call><|im_end|>";
    assert!(prompt.contains(call), "{prompt}");
    let result = "<|im_start|>user\n<tool_response>\n{\"temperature\": 21, \"sky\": \"sunny\"}\n</tool_response><|im_end|>";
    assert!(prompt.contains(result), "{prompt}");
    assert!(
        prompt.contains("<tools>") && prompt.contains("\"name\":\"get_weather\""),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
}

/// `auto` over SmolLM2-135M: its ChatML template knows no tools, so the server describes
/// them in the system message in the Hermes form. The model does not write
/// `<tool_call>` (greedy, it answers with prose and a code block that mentions the
/// tool), so what is checked is the other half: the tools reached the prompt, and the
/// Hermes parser turns the real reply, braces and `"type": "function"` text included,
/// into content and no call, streamed and not alike.
#[tokio::test]
async fn auto_without_a_call_is_plain_content_streamed_and_not() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let question = "What's the weather like in London right now? Use the tool.";
    let request = ask(json!({
        "tool_choice": "auto",
        "max_tokens": 60,
        "messages": [{"role": "user", "content": question}]
    }));
    let (status, whole) = post(&s.url("/v1/chat/completions"), &request).await;
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    let content = choice["message"]["content"].as_str().unwrap();
    assert!(
        choice["message"]["tool_calls"]
            .as_array()
            .is_none_or(|c| c.is_empty()),
        "{whole}"
    );
    assert_eq!(choice["finish_reason"], "length", "{whole}");
    // Only the system message described the tool by that name.
    assert!(content.contains("get_weather"), "{content}");
    assert!(content.contains('{'), "{content}");

    let mut none = request.clone();
    none["tool_choice"] = json!("none");
    let (_, plain) = post(&s.url("/v1/chat/completions"), &none).await;
    let with_tools = whole["usage"]["prompt_tokens"].as_u64().unwrap();
    let without = plain["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(with_tools > without + 50, "{with_tools} vs {without}");

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (status, events) = post_sse(&s.url("/v1/chat/completions"), &streamed).await;
    assert_eq!(status, 200);
    let mut text = String::new();
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        assert!(delta["tool_calls"].is_null(), "{chunk}");
        text.push_str(delta["content"].as_str().unwrap_or_default());
    }
    assert_eq!(text, content);
}
