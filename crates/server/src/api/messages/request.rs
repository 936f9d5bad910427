//! `POST /v1/messages` request bodies (Anthropic's Messages API), turned into the chat
//! request they stand for, so they are validated, templated and generated exactly as
//! chat is.
//!
//! `system` (a string or text blocks) becomes a leading system message. Each message's
//! content is a string or blocks: `text`; an assistant's `tool_use` becomes a chat tool
//! call (its `input` the call's arguments) and its `thinking` the turn's reasoning; a
//! user's `tool_result` becomes a `tool` message before the user's text (an error result
//! says so in its text). `stop_sequences` become `stop`, `metadata.user_id` the `user`,
//! `tools` chat function tools (`input_schema` their parameters), and `tool_choice`
//! `auto`/`any`/`tool`/`none` chat's `auto`/`required`/a named function/`none`, with
//! `disable_parallel_tool_use` as `parallel_tool_calls: false`. What cannot be honoured
//! (images, documents, server tools, cache lifetimes beyond the prefix cache) is refused
//! with a 400 naming the field.

use serde_json::{json, Map, Value};

use super::blocks::{blocks_text, check_cache_control, text_of, unsupported_block};
use super::tools::{chat_tool_choice, chat_tools, is_tool_result, tool_call, tool_result};
use crate::api::error::ServerError;
use crate::api::params::fields::NotedFields;

/// What a Messages request asks of thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// Not said, or `adaptive` / `between_tools`: the model's template decides.
    Unset,
    /// `{"type": "enabled", "budget_tokens": N}`: think, for at most `N` tokens.
    Enabled { budget_tokens: usize },
    /// `{"type": "disabled"}`: no thinking, where the template can be told so.
    Disabled,
}

/// A Messages request as the chat request it stands for.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    /// The chat completion body.
    pub chat: Value,
    pub thinking: Thinking,
    pub stream: bool,
    /// Top-level fields nothing read (unknown to this server), for the route to log.
    pub ignored: Vec<String>,
}

/// Fields copied to the chat request as they are.
const PASSED: [&str; 5] = ["model", "temperature", "top_p", "top_k", "stream"];

/// Reads `body` as a Messages request. `max_tokens` is required, as in Anthropic's API.
pub fn messages_request(body: &Value) -> Result<MessagesRequest, ServerError> {
    let object = body
        .as_object()
        .ok_or_else(|| ServerError::InvalidJson("the request body must be a JSON object".into()))?;
    let fields = NotedFields::new(object);
    let present = |k: &str| fields.present(k);
    let mut chat = Map::new();
    for key in PASSED {
        if let Some(v) = present(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    if present("model").is_none() {
        return Err(ServerError::invalid("model", "`model` is required"));
    }
    match present("max_tokens") {
        Some(v) => chat.insert("max_tokens".into(), v.clone()),
        None => {
            return Err(ServerError::invalid(
                "max_tokens",
                "`max_tokens` is required",
            ))
        }
    };
    if let Some(stops) = present("stop_sequences") {
        if !stops.is_array() {
            return Err(ServerError::invalid(
                "stop_sequences",
                "`stop_sequences` must be a list of strings",
            ));
        }
        chat.insert("stop".into(), stops.clone());
    }
    if let Some(metadata) = present("metadata") {
        let Value::Object(m) = metadata else {
            return Err(ServerError::invalid(
                "metadata",
                "`metadata` must be an object",
            ));
        };
        match m.get("user_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(user)) => {
                chat.insert("user".into(), json!(user));
            }
            Some(_) => {
                return Err(ServerError::invalid(
                    "metadata.user_id",
                    "`metadata.user_id` must be a string",
                ))
            }
        }
    }
    if let Some(cc) = present("cache_control") {
        check_cache_control(&json!({"cache_control": cc}), "")?;
    }
    if let Some(config) = present("output_config") {
        output_config(config, &mut chat)?;
    }
    if let Some(speed) = present("speed") {
        if speed != "standard" {
            return Err(ServerError::invalid(
                "speed",
                "only the `standard` speed is served here",
            ));
        }
    }
    for key in ["container", "mcp_servers", "context_management"] {
        if present(key).is_some() {
            return Err(ServerError::invalid(
                key,
                format!("`{key}` is not supported by this server"),
            ));
        }
    }
    if let Some(tier) = present("service_tier") {
        if tier != "auto" && tier != "standard_only" {
            return Err(ServerError::invalid(
                "service_tier",
                "`service_tier` may only be \"auto\" or \"standard_only\"",
            ));
        }
    }
    let mut messages = Vec::new();
    if let Some(system) = present("system") {
        let text = blocks_text(system, "system")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let Some(Value::Array(sent)) = present("messages") else {
        return Err(ServerError::invalid(
            "messages",
            "`messages` must be a list of messages",
        ));
    };
    for (i, m) in sent.iter().enumerate() {
        add_message(&mut messages, i, m)?;
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = present("tools") {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = present("tool_choice") {
        let (choice, parallel) = chat_tool_choice(choice)?;
        chat.insert("tool_choice".into(), choice);
        if let Some(parallel) = parallel {
            chat.insert("parallel_tool_calls".into(), json!(parallel));
        }
    }
    let thinking = match present("thinking") {
        None => Thinking::Unset,
        Some(t) => thinking(t)?,
    };
    let stream = present("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(MessagesRequest {
        chat: Value::Object(chat),
        thinking,
        stream,
        ignored: fields.unread(),
    })
}

/// `output_config`: `format` (a JSON schema the reply follows) becomes the chat's
/// `response_format`; `effort` its `reasoning_effort` (`xhigh` and `max` as `high`),
/// which only templates that read it take (validation refuses it otherwise).
fn output_config(config: &Value, chat: &mut Map<String, Value>) -> Result<(), ServerError> {
    let Value::Object(config) = config else {
        return Err(ServerError::invalid(
            "output_config",
            "`output_config` must be an object",
        ));
    };
    if let Some(effort) = config.get("effort").filter(|v| !v.is_null()) {
        let effort = match effort.as_str() {
            Some(e @ ("low" | "medium" | "high")) => e,
            Some("xhigh" | "max") => "high",
            _ => {
                return Err(ServerError::invalid(
                    "output_config.effort",
                    "`effort` must be low, medium, high, xhigh or max",
                ))
            }
        };
        chat.insert("reasoning_effort".into(), json!(effort));
    }
    if let Some(format) = config.get("format").filter(|v| !v.is_null()) {
        match (
            format.get("type").and_then(Value::as_str),
            format.get("schema"),
        ) {
            (Some("json_schema"), Some(schema)) => {
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
                );
            }
            _ => {
                return Err(ServerError::invalid(
                    "output_config.format",
                    "`format` must be {\"type\": \"json_schema\", \"schema\": ...}",
                ))
            }
        }
    }
    Ok(())
}

/// Adds message `i` (a user or assistant turn) to the chat messages.
fn add_message(messages: &mut Vec<Value>, i: usize, m: &Value) -> Result<(), ServerError> {
    let at = format!("messages.{i}");
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(ServerError::invalid(
                format!("{at}.role"),
                "a message's role must be \"user\" or \"assistant\"",
            ))
        }
    };
    let blocks = match m.get("content") {
        Some(Value::String(text)) => {
            messages.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(ServerError::invalid(
                format!("{at}.content"),
                "a message's content must be a string or a list of blocks",
            ))
        }
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut thinking = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content.{j}");
        check_cache_control(block, &at)?;
        let kind = block.get("type").and_then(Value::as_str);
        match (role, kind) {
            (_, Some("text")) => text.push(text_of(block, &at)?),
            ("assistant", Some("tool_use")) => calls.push(tool_call(block, &at)?),
            ("assistant", Some("thinking")) => {
                match block.get("thinking").and_then(Value::as_str) {
                    Some(t) => thinking.push(t.to_string()),
                    None => {
                        return Err(ServerError::invalid(
                            format!("{at}.thinking"),
                            "a thinking block needs `thinking`",
                        ))
                    }
                }
            }
            // Another model's encrypted thinking: nothing this model can read.
            ("assistant", Some("redacted_thinking")) => {}
            ("user", Some("tool_result")) => messages.push(tool_result(block, &at)?),
            (_, Some(k @ ("tool_use" | "thinking" | "redacted_thinking"))) => {
                return Err(ServerError::invalid(
                    format!("{at}.type"),
                    format!("`{k}` blocks belong to assistant messages"),
                ))
            }
            (_, Some("tool_result")) => {
                return Err(ServerError::invalid(
                    format!("{at}.type"),
                    "`tool_result` blocks belong to user messages",
                ))
            }
            (_, other) => return Err(unsupported_block(other, &at)),
        }
    }
    // A user turn of tool results alone adds no empty user message.
    if role == "user" && text.is_empty() && blocks.iter().any(is_tool_result) {
        return Ok(());
    }
    let mut message = json!({"role": role, "content": text.join("\n\n")});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    if !thinking.is_empty() {
        message["reasoning_content"] = json!(thinking.join("\n\n"));
    }
    messages.push(message);
    Ok(())
}

fn thinking(t: &Value) -> Result<Thinking, ServerError> {
    if let Some(display) = t.get("display").and_then(Value::as_str) {
        if display != "summarized" {
            return Err(ServerError::invalid(
                "thinking.display",
                "thinking is shown as it is generated: only `summarized` is served",
            ));
        }
    }
    match t.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(Thinking::Disabled),
        Some("adaptive" | "between_tools") => Ok(Thinking::Unset),
        Some("enabled") => match t.get("budget_tokens").and_then(Value::as_u64) {
            Some(budget) if budget >= 1 => Ok(Thinking::Enabled {
                budget_tokens: usize::try_from(budget).unwrap_or(usize::MAX),
            }),
            _ => Err(ServerError::invalid(
                "thinking.budget_tokens",
                "`thinking.budget_tokens` must be a positive integer",
            )),
        },
        _ => Err(ServerError::invalid(
            "thinking.type",
            "`thinking.type` must be \"enabled\", \"disabled\", \"adaptive\" or \"between_tools\"",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value) -> Result<MessagesRequest, ServerError> {
        messages_request(&body)
    }

    fn param(r: Result<MessagesRequest, ServerError>) -> String {
        match r {
            Err(e) => e.param().unwrap_or("(none)").to_string(),
            Ok(r) => panic!("accepted: {:?}", r.chat),
        }
    }

    #[test]
    fn a_conversation_with_tools_becomes_the_chat_it_stands_for() {
        let r = read(json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "metadata": {"user_id": "u1"}, "top_k": 5,
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
                    {"type": "text", "text": "Thanks"}]}],
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}
        }))
        .expect("valid");
        assert_eq!(r.thinking, Thinking::Unset);
        let chat = &r.chat;
        assert_eq!(chat["max_tokens"], 64);
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["user"], "u1");
        assert_eq!(chat["top_k"], 5);
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(
            chat["tools"][0],
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}, "description": "Weather"}})
        );
        let m = chat["messages"].as_array().expect("messages");
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[1],
            json!({"role": "user", "content": "Weather in Paris?"})
        );
        assert_eq!(m[2]["content"], "Let me check.");
        assert_eq!(m[2]["reasoning_content"], "Use the tool.");
        assert_eq!(
            m[2]["tool_calls"][0],
            json!({"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}})
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21C"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "Thanks"}));
    }

    #[test]
    fn error_results_say_so_and_results_alone_add_no_user_turn() {
        let r = read(json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": true}]}]}))
        .expect("valid");
        assert_eq!(
            r.chat["messages"],
            json!([{"role": "tool", "tool_call_id": "t", "content": "Error: boom"}])
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let base = |extra: Value| {
            let mut b = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
            b.as_object_mut()
                .expect("object")
                .extend(extra.as_object().expect("object").clone());
            b
        };
        assert_eq!(
            param(read(json!({"model": "m", "messages": []}))),
            "max_tokens"
        );
        let image =
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]});
        assert_eq!(param(read(base(image))), "messages.0.content.0.type");
        let server_tool = json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert_eq!(param(read(base(server_tool))), "tools.0.type");
        let ttl = json!({"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]});
        assert_eq!(param(read(base(ttl))), "system.0.cache_control.ttl");
        let choice = json!({"tool_choice": {"type": "tool"}});
        assert_eq!(param(read(base(choice))), "tool_choice.name");
        let budget = json!({"thinking": {"type": "enabled", "budget_tokens": 0}});
        assert_eq!(param(read(base(budget))), "thinking.budget_tokens");
        let role = json!({"messages": [{"role": "system", "content": "x"}]});
        assert_eq!(param(read(base(role))), "messages.0.role");
        let misplaced = json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]});
        assert_eq!(param(read(base(misplaced))), "messages.0.content.0.type");
        assert_eq!(param(read(base(json!({"mcp_servers": []})))), "mcp_servers");
        let fine = base(
            json!({"thinking": {"type": "enabled", "budget_tokens": 1024}, "anthropic_version": "x"}),
        );
        let r = read(fine).expect("valid");
        assert_eq!(
            r.thinking,
            Thinking::Enabled {
                budget_tokens: 1024
            }
        );
        assert_eq!(r.ignored, vec!["anthropic_version".to_string()]);
    }
}
