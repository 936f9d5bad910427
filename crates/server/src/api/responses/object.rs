//! Response objects of `/v1/responses` in OpenAI's shape: the `response` itself, its
//! output items (`message` with `output_text`, `function_call`) and usage.

use serde_json::{json, Value};

use crate::api::response::{TokenLogprob, Usage};

/// What every response object of one request repeats: ids and the request's settings.
#[derive(Debug, Clone)]
pub struct ResponseHeader {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// The request body, whose settings are echoed.
    pub request: Value,
}

impl ResponseHeader {
    /// The response object. `incomplete` names why it stopped short (`max_output_tokens`).
    pub fn object(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<OutputUsage>,
        incomplete: Option<&str>,
    ) -> Value {
        let r = &self.request;
        let or = |key: &str, default: Value| {
            r.get(key)
                .filter(|v| !v.is_null())
                .cloned()
                .unwrap_or(default)
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "instructions": or("instructions", Value::Null),
            "max_output_tokens": or("max_output_tokens", Value::Null),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": or("parallel_tool_calls", json!(true)),
            "previous_response_id": null,
            "store": false,
            "temperature": or("temperature", json!(1.0)),
            "top_p": or("top_p", json!(1.0)),
            "text": or("text", json!({"format": {"type": "text"}})),
            "tool_choice": or("tool_choice", json!("auto")),
            "tools": or("tools", json!([])),
            "truncation": "disabled",
            "metadata": or("metadata", json!({})),
            "usage": usage.map(usage_object),
        })
    }
}

/// A response's token counts: the usage, and how many output tokens were thinking.
#[derive(Debug, Clone, Copy)]
pub struct OutputUsage {
    pub usage: Usage,
    pub reasoning_tokens: usize,
}

/// Usage in the Responses shape.
fn usage_object(u: OutputUsage) -> Value {
    json!({
        "input_tokens": u.usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": u.usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.usage.total_tokens,
    })
}

/// A reasoning item holding the model's thinking (empty while it streams).
pub fn reasoning_item(id: &str, status: &str, text: &str) -> Value {
    let content: Vec<Value> = match text.is_empty() {
        true => Vec::new(),
        false => vec![json!({"type": "reasoning_text", "text": text})],
    };
    json!({
        "type": "reasoning",
        "id": id,
        "summary": [],
        "content": content,
        "status": status,
    })
}

/// An assistant message item holding `text` and the log-probabilities of its tokens
/// (empty unless the request included them).
pub fn message_item(id: &str, status: &str, text: Option<(&str, &[TokenLogprob])>) -> Value {
    let content: Vec<Value> = text
        .map(|(t, logprobs)| vec![output_text_part(t, logprobs)])
        .unwrap_or_default();
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

/// An `output_text` content part.
pub fn output_text_part(text: &str, logprobs: &[TokenLogprob]) -> Value {
    json!({
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": logprob_values(logprobs),
    })
}

/// Log-probabilities in the Responses shape: each token with its bytes and its most
/// likely alternatives.
pub fn logprob_values(tokens: &[TokenLogprob]) -> Vec<Value> {
    tokens
        .iter()
        .map(|t| {
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|(token, logprob)| {
                    json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
                })
                .collect();
            json!({
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.token.as_bytes(),
                "top_logprobs": top,
            })
        })
        .collect()
}

/// A function call item.
pub fn function_call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// The response status and incomplete reason for a finish reason.
pub fn status_of(finish_reason: &str) -> (&'static str, Option<&'static str>) {
    match finish_reason {
        "length" => ("incomplete", Some("max_output_tokens")),
        _ => ("completed", None),
    }
}
