//! `POST /v1/responses` request bodies, stateless: turned into the chat request they
//! stand for, so they are validated, templated and generated exactly as chat is.
//!
//! `input` is a string (one user message) or a list of items: messages (`role` and a
//! string or `input_text`/`output_text` parts), `function_call` (an assistant tool call)
//! and `function_call_output` (a tool result). `instructions` becomes a leading system
//! message, `max_output_tokens` the token budget, `text.format` the `response_format`,
//! function `tools` the chat tools, `include: ["message.output_text.logprobs"]` and
//! `top_logprobs` chat's `logprobs` and `top_logprobs`. Nothing is stored: `store: true`,
//! `previous_response_id` and `conversation` are refused.

use serde_json::{json, Map, Value};

use crate::api::error::ServerError;
use crate::api::params::fields::NotedFields;

/// Fields copied to the chat request as they are.
const PASSED: [&str; 6] = [
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "stream",
    "user",
];

/// The one `include` value served: log-probabilities of the output text.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// The chat request body `body` stands for, and the top-level fields of `body` that
/// nothing read (unknown to this server), for the route to log.
pub fn chat_body(body: &Value) -> Result<(Value, Vec<String>), ServerError> {
    let object = body
        .as_object()
        .ok_or_else(|| ServerError::InvalidJson("the request body must be a JSON object".into()))?;
    // Every field is read through `present`, which notes its name.
    let fields = NotedFields::new(object);
    let present = |k: &str| fields.present(k);
    if present("store").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ServerError::invalid(
            "store",
            "responses are not stored: send `store`: false (or leave it out) and pass the \
             whole conversation in `input`",
        ));
    }
    for key in ["previous_response_id", "conversation"] {
        if present(key).is_some() {
            return Err(ServerError::invalid(
                key,
                format!(
                    "`{key}` is not supported: responses are not stored, so pass the whole \
                     conversation in `input`"
                ),
            ));
        }
    }
    for key in ["background", "prompt", "max_tool_calls", "truncation"] {
        if present(key).is_some() {
            return Err(ServerError::invalid(
                key,
                format!("`{key}` is not supported"),
            ));
        }
    }
    let mut chat = Map::new();
    for key in PASSED {
        if let Some(v) = present(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(v) = present("max_output_tokens") {
        chat.insert("max_completion_tokens".into(), v.clone());
    }
    if let Some(effort) = reasoning_effort(present("reasoning"))? {
        chat.insert("reasoning_effort".into(), effort);
    }
    let mut messages = Vec::new();
    match present("instructions") {
        None => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => {
            return Err(ServerError::invalid(
                "instructions",
                "`instructions` must be a string",
            ))
        }
    }
    match present("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                add_item(&mut messages, i, item)?;
            }
            // A reasoning item that no message or call followed: a turn of thinking only.
            for m in &mut messages {
                if m["content"].is_null() && m.get("tool_calls").is_none() {
                    m["content"] = json!("");
                }
            }
        }
        Some(_) => {
            return Err(ServerError::invalid(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
        None => return Err(ServerError::invalid("input", "`input` is required")),
    }
    chat.insert("messages".into(), Value::Array(messages));
    if logprobs_included(present("include"))? {
        if calls_possible(present("tools"), present("tool_choice")) {
            return Err(ServerError::invalid(
                "include",
                format!(
                    "`include` of `{INCLUDE_LOGPROBS}` is not supported together with \
                     function tools: leave out `tools`, or set `tool_choice` to \"none\""
                ),
            ));
        }
        chat.insert("logprobs".into(), Value::Bool(true));
        if let Some(top) = present("top_logprobs") {
            chat.insert("top_logprobs".into(), top.clone());
        }
    } else if present("top_logprobs").is_some() {
        return Err(ServerError::invalid(
            "top_logprobs",
            format!("`top_logprobs` needs `include`: [\"{INCLUDE_LOGPROBS}\"]"),
        ));
    }
    if let Some(format) = present("text").and_then(|t| t.get("format")) {
        chat.insert("response_format".into(), response_format(format)?);
    }
    if let Some(tools) = present("tools") {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = present("tool_choice") {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    Ok((Value::Object(chat), fields.unread()))
}

/// Whether `include` asks for the output text's log-probabilities; any other value is
/// refused by name.
fn logprobs_included(include: Option<&Value>) -> Result<bool, ServerError> {
    let Some(include) = include else {
        return Ok(false);
    };
    let values = include
        .as_array()
        .ok_or_else(|| ServerError::invalid("include", "`include` must be a list of strings"))?;
    let mut logprobs = false;
    for value in values {
        match value.as_str() {
            Some(INCLUDE_LOGPROBS) => logprobs = true,
            Some(other) => {
                return Err(ServerError::invalid(
                    "include",
                    format!(
                        "`include` value `{other}` is not supported: only \"{INCLUDE_LOGPROBS}\""
                    ),
                ))
            }
            None => {
                return Err(ServerError::invalid(
                    "include",
                    "`include` must be a list of strings",
                ))
            }
        }
    }
    Ok(logprobs)
}

/// Whether the reply may hold function calls: tools given and `tool_choice` not "none".
fn calls_possible(tools: Option<&Value>, choice: Option<&Value>) -> bool {
    let any_tool = tools
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    any_tool && choice.and_then(Value::as_str) != Some("none")
}

/// A refusal of the chat request made from a Responses request, naming the Responses
/// field the client sent: `reasoning.effort` where chat says `reasoning_effort`.
pub fn in_responses_terms(e: ServerError) -> ServerError {
    match e {
        ServerError::InvalidRequest {
            message,
            param: Some(param),
        } if param == "reasoning_effort" => ServerError::InvalidRequest {
            message: message.replace("`reasoning_effort`", "`reasoning.effort`"),
            param: Some("reasoning.effort".to_string()),
        },
        other => other,
    }
}

/// `reasoning: {"effort": ...}` as chat's `reasoning_effort` (which the template must
/// read); a reasoning summary is refused, since none is written.
fn reasoning_effort(reasoning: Option<&Value>) -> Result<Option<Value>, ServerError> {
    let Some(reasoning) = reasoning.filter(|r| !r.is_null()) else {
        return Ok(None);
    };
    let Some(fields) = reasoning.as_object() else {
        return Err(ServerError::invalid(
            "reasoning",
            "`reasoning` must be an object",
        ));
    };
    if let Some((key, _)) = fields.iter().find(|(k, v)| *k != "effort" && !v.is_null()) {
        return Err(ServerError::invalid(
            format!("reasoning.{key}"),
            format!("`reasoning.{key}` is not supported"),
        ));
    }
    Ok(fields.get("effort").filter(|e| !e.is_null()).cloned())
}

fn add_item(messages: &mut Vec<Value>, i: usize, item: &Value) -> Result<(), ServerError> {
    let at = |field: &str| format!("input[{i}]{field}");
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
                ServerError::invalid(at(".role"), "a message item needs a `role`")
            })?;
            let role = match role {
                "developer" => "system",
                r @ ("system" | "user" | "assistant") => r,
                other => {
                    return Err(ServerError::invalid(
                        at(".role"),
                        format!("unsupported role `{other}`"),
                    ))
                }
            };
            let content = message_text(item.get("content")).ok_or_else(|| {
                ServerError::invalid(
                    at(".content"),
                    "message content must be a string or a list of input_text/output_text parts",
                )
            })?;
            // An assistant message after a reasoning item is the turn that thought.
            match thinking_turn(messages).filter(|_| role == "assistant") {
                Some(turn) => turn["content"] = json!(content),
                None => messages.push(json!({"role": role, "content": content})),
            }
        }
        "reasoning" => {
            let text = reasoning_text(item).ok_or_else(|| {
                ServerError::invalid(
                    at(".content"),
                    "a reasoning item needs `content` of reasoning_text parts or `summary` of \
                     summary_text parts",
                )
            })?;
            messages.push(json!({"role": "assistant", "content": null, "reasoning": text}));
        }
        "function_call" => {
            let field = |name: &str| {
                item.get(name).and_then(Value::as_str).ok_or_else(|| {
                    ServerError::invalid(
                        at(&format!(".{name}")),
                        format!("a function_call item needs a string `{name}`"),
                    )
                })
            };
            let call = json!({
                "id": field("call_id")?,
                "type": "function",
                "function": {"name": field("name")?, "arguments": field("arguments")?},
            });
            // Calls that follow each other, or a reasoning item, belong to one assistant
            // turn.
            if let Some(turn) = thinking_turn(messages) {
                turn["tool_calls"] = json!([]);
            }
            let joined = messages.last_mut().filter(|m| {
                m["role"] == "assistant" && m.get("tool_calls").is_some_and(Value::is_array)
            });
            match joined {
                Some(last) => {
                    if let Some(calls) = last["tool_calls"].as_array_mut() {
                        calls.push(call);
                    }
                }
                None => messages.push(json!({
                    "role": "assistant", "content": null, "tool_calls": [call],
                })),
            }
        }
        "function_call_output" => {
            let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                ServerError::invalid(
                    at(".call_id"),
                    "a function_call_output item needs a string `call_id`",
                )
            })?;
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => message_text(Some(other)).ok_or_else(|| {
                    ServerError::invalid(at(".output"), "`output` must be a string")
                })?,
                None => {
                    return Err(ServerError::invalid(
                        at(".output"),
                        "a function_call_output item needs `output`",
                    ))
                }
            };
            messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
        }
        other => {
            return Err(ServerError::invalid(
                at(".type"),
                format!(
                    "input item type `{other}` is not supported: use message, reasoning, \
                     function_call or function_call_output"
                ),
            ))
        }
    }
    Ok(())
}

/// The last message, when it is an assistant turn that has only thought so far.
fn thinking_turn(messages: &mut [Value]) -> Option<&mut Value> {
    messages.last_mut().filter(|m| {
        m["role"] == "assistant"
            && m.get("reasoning").is_some()
            && m["content"].is_null()
            && m.get("tool_calls").is_none()
    })
}

/// A reasoning item's text: its `reasoning_text` parts, else its `summary_text` parts.
fn reasoning_text(item: &Value) -> Option<String> {
    let parts = |field: &str, kind: &str| -> Option<String> {
        let texts: Vec<&str> = item
            .get(field)?
            .as_array()?
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some(kind))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    };
    parts("content", "reasoning_text").or_else(|| parts("summary", "summary_text"))
}

/// The text of a message's content: a string, or text parts joined.
fn message_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("input_text" | "output_text" | "text") => {
                    p.get("text").and_then(Value::as_str).map(str::to_string)
                }
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|texts| texts.concat()),
        _ => None,
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(format: &Value) -> Result<Value, ServerError> {
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(json!({"type": "text"})),
        Some("json_object") => Ok(json!({"type": "json_object"})),
        Some("json_schema") => {
            let mut spec = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key) {
                    spec.insert(key.into(), v.clone());
                }
            }
            Ok(json!({"type": "json_schema", "json_schema": spec}))
        }
        _ => Err(ServerError::invalid(
            "text.format",
            "`text.format` must have `type` \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// Responses' flat function tools as chat's.
fn chat_tools(tools: &Value) -> Result<Value, ServerError> {
    let tools = tools
        .as_array()
        .ok_or_else(|| ServerError::invalid("tools", "`tools` must be a list of tools"))?;
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(ServerError::invalid(
                    format!("tools[{i}].type"),
                    format!(
                        "tool type `{}` is not supported: only \"function\"",
                        other.unwrap_or("(missing)")
                    ),
                ))
            }
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = tool.get(key) {
                function.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` as chat's: the named form is `{"type": "function", "name": ...}`.
fn chat_tool_choice(choice: &Value) -> Result<Value, ServerError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                ServerError::invalid("tool_choice", "a named `tool_choice` needs `name`")
            })?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ServerError::invalid(
            "tool_choice",
            "`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
