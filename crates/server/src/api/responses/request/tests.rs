//! `POST /v1/responses` bodies turned into chat requests, and what is refused.

use super::*;

#[test]
fn items_become_chat_messages() {
    let (chat, _) = chat_body(&json!({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 9,
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\": 1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"}
        ],
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"}
    }))
    .unwrap();
    assert_eq!(chat["max_completion_tokens"], 9);
    let roles: Vec<&str> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "system", "user", "assistant", "tool"]);
    assert_eq!(chat["messages"][2]["content"], "Hi");
    assert_eq!(
        chat["messages"][3]["tool_calls"].as_array().unwrap().len(),
        2
    );
    assert_eq!(chat["messages"][4]["tool_call_id"], "c1");
    assert_eq!(chat["response_format"]["json_schema"]["name"], "s");
    assert_eq!(chat["tools"][0]["function"]["name"], "f");
    assert_eq!(chat["tool_choice"]["function"]["name"], "f");
}

#[test]
fn reasoning_items_join_the_assistant_turn_that_follows() {
    let thought = |text: &str| {
        json!({"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": text}]})
    };
    let (chat, _) = chat_body(&json!({
        "model": "m",
        "input": [
            {"role": "user", "content": "Weather?"},
            thought("Call the tool."),
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sun"},
            thought("Answer now."),
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Sunny."}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Only."}]},
            {"role": "user", "content": "Thanks"}
        ]
    }))
    .unwrap();
    let messages = chat["messages"].as_array().unwrap();
    let shape: Vec<(&str, Value, Value)> = messages
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap(),
                m["reasoning"].clone(),
                m["content"].clone(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("user", Value::Null, json!("Weather?")),
            ("assistant", json!("Call the tool."), Value::Null),
            ("tool", Value::Null, json!("sun")),
            ("assistant", json!("Answer now."), json!("Sunny.")),
            ("assistant", json!("Only."), json!("")),
            ("user", Value::Null, json!("Thanks")),
        ]
    );
    assert_eq!(messages[1]["tool_calls"][0]["id"], "c1");
    let bad = chat_body(&json!({"model": "m", "input": [{"type": "reasoning", "content": 3}]}));
    assert_eq!(
        bad.err().as_ref().and_then(ServerError::param),
        Some("input[0].content")
    );
}

#[test]
fn stored_and_unsupported_requests_are_refused_by_name() {
    for (body, param) in [
        (json!({"model": "m", "input": "x", "store": true}), "store"),
        (
            json!({"model": "m", "input": "x", "previous_response_id": "r"}),
            "previous_response_id",
        ),
        (json!({"model": "m"}), "input"),
        (
            json!({"model": "m", "input": [{"type": "image", "url": "u"}]}),
            "input[0].type",
        ),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "file_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"model": "m", "input": "x", "reasoning": {"summary": "auto"}}),
            "reasoning.summary",
        ),
        (
            json!({"model": "m", "input": "x", "reasoning": "low"}),
            "reasoning",
        ),
        (
            json!({"model": "m", "input": "x", "include": ["file_search_call.results"]}),
            "include",
        ),
        (
            json!({"model": "m", "input": "x", "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            json!({"model": "m", "input": "x", "include": [INCLUDE_LOGPROBS],
                   "tools": [{"type": "function", "name": "f"}]}),
            "include",
        ),
    ] {
        let e = chat_body(&body).expect_err(&body.to_string());
        assert_eq!(e.param(), Some(param), "{body}");
    }
    assert!(chat_body(&json!({"model": "m", "input": "x", "store": false})).is_ok());
    // An effort reaches chat, which gives it to a template that reads it.
    let (chat, _) = chat_body(
        &json!({"model": "m", "input": "x", "reasoning": {"effort": "high", "summary": null}}),
    )
    .unwrap();
    assert_eq!(chat["reasoning_effort"], "high");
}

#[test]
fn included_logprobs_become_chat_logprobs() {
    let (chat, _) = chat_body(&json!({
        "model": "m", "input": "x", "include": [INCLUDE_LOGPROBS], "top_logprobs": 3,
        "tools": [{"type": "function", "name": "f"}], "tool_choice": "none"
    }))
    .unwrap();
    assert_eq!(chat["logprobs"], true);
    assert_eq!(chat["top_logprobs"], 3);
    let (plain, _) = chat_body(&json!({"model": "m", "input": "x", "include": []})).unwrap();
    assert!(plain.get("logprobs").is_none(), "{plain}");
}

#[test]
fn only_fields_nothing_reads_are_noted_as_ignored() {
    let (_, ignored) = chat_body(&json!({
        "model": "m", "input": "x", "instructions": "be brief", "temperature": 0.2,
        "top_p": 0.9, "stream": true, "user": "u", "max_output_tokens": 5,
        "store": false, "include": [INCLUDE_LOGPROBS], "top_logprobs": 2,
        "text": {"format": {"type": "text"}}, "tool_choice": "none",
        "parallel_tool_calls": false,
    }))
    .unwrap();
    assert_eq!(ignored, Vec::<String>::new());
    let (_, ignored) = chat_body(&json!({
        "model": "m", "input": "x", "metadata": {"k": "v"}, "top_a": 0.1,
    }))
    .unwrap();
    assert_eq!(ignored, ["metadata", "top_a"]);
}
