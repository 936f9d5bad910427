//! The Messages API's reply: the message object, its content blocks (`thinking`,
//! `text`, `tool_use`), its stop reason and its usage.

use serde_json::{json, Value};

/// The parts of a message that do not change while it is generated.
#[derive(Debug, Clone)]
pub struct MessageHeader {
    pub id: String,
    pub model: String,
}

impl MessageHeader {
    /// The message object with `content` so far.
    pub fn object(
        &self,
        content: Vec<Value>,
        stop_reason: Option<&str>,
        stop_sequence: Option<&str>,
        usage: Value,
    ) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        })
    }
}

/// Anthropic's usage: `input_tokens` are the prompt's tokens not read from the prefix
/// cache, `cache_read_input_tokens` those that were.
pub fn usage(prompt_tokens: usize, output_tokens: usize, cached_tokens: usize) -> Value {
    let cached = cached_tokens.min(prompt_tokens);
    json!({
        "input_tokens": prompt_tokens - cached,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

pub fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// A thinking block. Thinking is not signed here: the signature is empty.
pub fn thinking_block(thinking: &str) -> Value {
    json!({"type": "thinking", "thinking": thinking, "signature": ""})
}

pub fn tool_use_block(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

/// A call's arguments as a `tool_use` block's input, when they are a JSON object.
pub fn tool_input(arguments: &str) -> Option<Value> {
    let arguments = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// Why generation stopped: a tool call, a stop sequence, the token budget, or the end
/// of the turn.
pub fn stop_reason(
    finish_reason: &str,
    stop_sequence: Option<&str>,
    made_calls: bool,
) -> &'static str {
    match (made_calls, stop_sequence, finish_reason) {
        (true, _, _) => "tool_use",
        (false, Some(_), _) => "stop_sequence",
        (false, None, "length") => "max_tokens",
        _ => "end_turn",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_and_usage() {
        assert_eq!(stop_reason("stop", None, false), "end_turn");
        assert_eq!(stop_reason("stop", Some("END"), false), "stop_sequence");
        assert_eq!(stop_reason("length", None, false), "max_tokens");
        assert_eq!(stop_reason("stop", None, true), "tool_use");
        let u = usage(40, 7, 32);
        assert_eq!(u["input_tokens"], 8);
        assert_eq!(u["cache_read_input_tokens"], 32);
        assert_eq!(u["output_tokens"], 7);
        assert_eq!(tool_input("{\"a\": 1}"), Some(json!({"a": 1})));
        assert_eq!(tool_input(""), Some(json!({})));
        assert_eq!(tool_input("[1]"), None);
    }
}
