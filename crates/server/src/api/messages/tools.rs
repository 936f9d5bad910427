//! Anthropic's tool blocks and tool definitions as chat's: `tool_use` blocks become tool
//! calls, `tool_result` blocks `tool` messages, `tools` function tools, and `tool_choice`
//! chat's choice with `disable_parallel_tool_use`.

use serde_json::{json, Value};

use super::blocks::{blocks_text, check_cache_control};
use crate::api::error::ServerError;

pub(super) fn is_tool_result(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_result")
}

/// An assistant's `tool_use` block as a chat tool call.
pub(super) fn tool_call(block: &Value, at: &str) -> Result<Value, ServerError> {
    let field = |k: &str| {
        block.get(k).and_then(Value::as_str).ok_or_else(|| {
            ServerError::invalid(format!("{at}.{k}"), format!("a tool_use block needs `{k}`"))
        })
    };
    let (id, name) = (field("id")?, field("name")?);
    let input = match block.get("input") {
        Some(v @ Value::Object(_)) => v.to_string(),
        _ => {
            return Err(ServerError::invalid(
                format!("{at}.input"),
                "a tool_use block's `input` must be an object",
            ))
        }
    };
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
}

/// A user's `tool_result` block as a chat `tool` message.
pub(super) fn tool_result(block: &Value, at: &str) -> Result<Value, ServerError> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ServerError::invalid(
                format!("{at}.tool_use_id"),
                "a tool_result block needs `tool_use_id`",
            )
        })?;
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(c) => blocks_text(c, &format!("{at}.content"))?,
    };
    let content = match block.get("is_error").and_then(Value::as_bool) {
        Some(true) => format!("Error: {content}"),
        _ => content,
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

/// `tools` as chat function tools; server tools are refused.
pub(super) fn chat_tools(tools: &Value) -> Result<Value, ServerError> {
    let Value::Array(list) = tools else {
        return Err(ServerError::invalid("tools", "`tools` must be a list"));
    };
    let mut out = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools.{i}");
        if let Some(kind) = tool.get("type").and_then(Value::as_str) {
            if kind != "custom" {
                return Err(ServerError::invalid(
                    format!("{at}.type"),
                    format!("`{kind}` is a server tool, and this server runs none"),
                ));
            }
        }
        check_cache_control(tool, &at)?;
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ServerError::invalid(format!("{at}.name"), "a tool needs a `name`"))?;
        let Some(schema @ Value::Object(_)) = tool.get("input_schema") else {
            return Err(ServerError::invalid(
                format!("{at}.input_schema"),
                "a tool needs an `input_schema` object",
            ));
        };
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(description) = tool.get("description").filter(|d| !d.is_null()) {
            function["description"] = description.clone();
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` as chat's, and whether parallel calls are allowed when it says.
pub(super) fn chat_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), ServerError> {
    let kind = choice.get("type").and_then(Value::as_str);
    let parallel = match choice.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(disable)) => Some(!disable),
        Some(_) => {
            return Err(ServerError::invalid(
                "tool_choice.disable_parallel_tool_use",
                "`disable_parallel_tool_use` must be a boolean",
            ))
        }
    };
    let chat = match kind {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(ServerError::invalid(
                    "tool_choice.name",
                    "`tool_choice` of type \"tool\" needs the tool's `name`",
                ))
            }
        },
        _ => {
            return Err(ServerError::invalid(
                "tool_choice.type",
                "`tool_choice.type` must be \"auto\", \"any\", \"tool\" or \"none\"",
            ))
        }
    };
    Ok((chat, parallel))
}
