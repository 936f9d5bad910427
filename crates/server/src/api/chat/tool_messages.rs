//! The tool parts of a conversation as sent: assistant `tool_calls` and the
//! `tool_call_id` of `role: "tool"` messages, checked and put in the form chat templates
//! expect.
//!
//! OpenAI sends a call's `arguments` as a JSON string; chat templates (and transformers,
//! which renders them) expect the arguments as an object, and write it with `tojson`.
//! So each call's arguments are parsed here, and a string that is not a JSON object is
//! refused.

use serde_json::{json, Value};

use crate::api::chat::message::ChatMessageIn;
use crate::api::error::ServerError;

/// The `tool_calls` of message `i`, for the template; `None` when it has none.
pub fn assistant_tool_calls(i: usize, m: &ChatMessageIn) -> Result<Option<Value>, ServerError> {
    let calls = match &m.tool_calls {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(calls)) if m.role == "assistant" => calls,
        Some(Value::Array(_)) => {
            return Err(ServerError::invalid(
                format!("messages[{i}].tool_calls"),
                "only assistant messages carry `tool_calls`",
            ))
        }
        Some(_) => {
            return Err(ServerError::invalid(
                format!("messages[{i}].tool_calls"),
                "`tool_calls` must be a list",
            ))
        }
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].tool_calls[{j}]{field}");
        let id = call.get("id").and_then(Value::as_str).ok_or_else(|| {
            ServerError::invalid(at(".id"), "every tool call needs a string `id`")
        })?;
        if let Some(kind) = call.get("type").and_then(Value::as_str) {
            if kind != "function" {
                return Err(ServerError::invalid(
                    at(".type"),
                    format!("tool call type `{kind}` is not supported: only \"function\""),
                ));
            }
        }
        let function = call.get("function").ok_or_else(|| {
            ServerError::invalid(at(".function"), "a tool call needs a `function`")
        })?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ServerError::invalid(at(".function.name"), "a tool call needs a function `name`")
            })?;
        let arguments = match function.get("arguments") {
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(v @ Value::Object(_)) => v,
                _ => {
                    return Err(ServerError::invalid(
                        at(".function.arguments"),
                        "`arguments` must be a JSON object, written as a string",
                    ))
                }
            },
            Some(v @ Value::Object(_)) => v.clone(),
            _ => {
                return Err(ServerError::invalid(
                    at(".function.arguments"),
                    "a tool call needs `arguments`: a JSON object, written as a string",
                ))
            }
        };
        out.push(json!({
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }));
    }
    Ok(Some(Value::Array(out)))
}

/// The `tool_call_id` a `role: "tool"` message answers.
pub fn tool_call_id(i: usize, m: &ChatMessageIn) -> Result<String, ServerError> {
    m.tool_call_id.clone().ok_or_else(|| {
        ServerError::invalid(
            format!("messages[{i}].tool_call_id"),
            "a tool message needs the `tool_call_id` of the call it answers",
        )
    })
}
