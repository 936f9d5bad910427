//! `POST /v1/chat/completions` request body, as sent.

use serde::Deserialize;
use serde_json::{Map, Value};
use tessera_tokenizer::{ChatMessage, MessageContent};

use crate::api::chat::message::ChatMessageIn;
use crate::api::chat::render::RenderFields;
use crate::api::chat::tool_messages::{assistant_tool_calls, tool_call_id};
use crate::api::error::ServerError;
use crate::api::params::fields::{
    as_object, parse_noting_ignored, refuse_unsupported, GenerationParams, IgnoredFields, Route,
};
use crate::api::tools::request::ToolRequest;

/// Chat-only fields; the shared ones are in [`GenerationParams`].
#[derive(Debug, Clone, Deserialize)]
pub struct ChatFields {
    pub messages: Vec<ChatMessageIn>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    /// Checked by [`ToolRequest::parse`].
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
}

/// A chat request whose fields parsed; values are checked by validation.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub params: GenerationParams,
    pub chat: ChatFields,
    pub render: RenderFields,
    /// Paths of the body's fields that nothing reads (unknown to this server).
    pub ignored: Vec<String>,
}

impl ChatRequest {
    pub fn parse(body: &Value) -> Result<Self, ServerError> {
        let object = as_object(body)?;
        let checked = refuse_unsupported(object, Route::Chat)?;
        let mut ignored = IgnoredFields::default();
        Ok(ChatRequest {
            params: parse_noting_ignored(body, &mut ignored)?,
            chat: parse_noting_ignored(body, &mut ignored)?,
            render: parse_noting_ignored(body, &mut ignored)?,
            ignored: ignored.paths(&checked),
        })
    }

    /// The messages in the form the chat template takes; refuses roles and content part
    /// types we cannot render.
    pub fn template_messages(&self) -> Result<Vec<ChatMessage>, ServerError> {
        template_messages(&self.chat.messages)
    }

    /// The checked `tools`, `tool_choice` and `parallel_tool_calls`.
    pub fn tool_request(&self) -> Result<Option<ToolRequest>, ServerError> {
        ToolRequest::parse(
            self.chat.tools.as_ref(),
            self.chat.tool_choice.as_ref(),
            self.chat.parallel_tool_calls.as_ref(),
        )
    }
}

/// Messages as sent to the form the chat template takes; refuses roles and content part
/// types we cannot render.
pub fn template_messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ServerError> {
    if messages.is_empty() {
        return Err(ServerError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| convert_message(i, m))
        .collect()
}

fn convert_message(i: usize, m: &ChatMessageIn) -> Result<ChatMessage, ServerError> {
    // OpenAI's `developer` messages are the system messages of chat templates.
    let role = match m.role.as_str() {
        "developer" => "system",
        r @ ("system" | "user" | "assistant" | "tool") => r,
        other => {
            return Err(ServerError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "unsupported role `{other}`: use system, developer, user, assistant or tool"
                ),
            ))
        }
    };
    let mut extra = Map::new();
    if let Some(thinking) = m.reasoning.as_ref().or(m.reasoning_content.as_ref()) {
        if role != "assistant" {
            return Err(ServerError::invalid(
                format!("messages[{i}].reasoning"),
                "only assistant messages carry reasoning",
            ));
        }
        // Qwen3's templates read `reasoning_content`, gpt-oss's `thinking`.
        for key in ["reasoning_content", "thinking"] {
            extra.insert(key.into(), Value::String(thinking.clone()));
        }
    }
    let tool_calls = assistant_tool_calls(i, m)?;
    if m.role == "tool" {
        extra.insert("tool_call_id".into(), Value::String(tool_call_id(i, m)?));
    }
    // An assistant turn that only calls tools has no content; templates join content
    // to strings, so it is rendered as "".
    if tool_calls.is_some() && m.content.as_ref().is_none_or(Value::is_null) {
        extra.insert("tool_calls".into(), tool_calls.unwrap_or_default());
        if let Some(name) = &m.name {
            extra.insert("name".into(), Value::String(name.clone()));
        }
        return Ok(ChatMessage {
            role: role.to_string(),
            content: Some(MessageContent::Text(String::new())),
            extra,
        });
    }
    if let Some(calls) = tool_calls {
        extra.insert("tool_calls".into(), calls);
    }
    let content = match &m.content {
        None | Some(Value::Null) => {
            return Err(ServerError::invalid(
                format!("messages[{i}].content"),
                "every message needs `content`",
            ))
        }
        Some(Value::String(s)) => MessageContent::Text(s.clone()),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                let text = part.get("text").and_then(Value::as_str);
                match (kind, text) {
                    (Some("text"), Some(_)) => {}
                    (Some("text"), None) => {
                        return Err(ServerError::invalid(
                            format!("messages[{i}].content[{j}].text"),
                            "a text part needs a string `text`",
                        ))
                    }
                    (other, _) => {
                        return Err(ServerError::invalid(
                            format!("messages[{i}].content[{j}].type"),
                            format!(
                                "content part type `{}` is not supported: only \"text\"",
                                other.unwrap_or("(missing)")
                            ),
                        ))
                    }
                }
            }
            MessageContent::Parts(parts.clone())
        }
        Some(_) => {
            return Err(ServerError::invalid(
                format!("messages[{i}].content"),
                "`content` must be a string or a list of text parts",
            ))
        }
    };
    if let Some(name) = &m.name {
        extra.insert("name".into(), Value::String(name.clone()));
    }
    Ok(ChatMessage {
        role: role.to_string(),
        content: Some(content),
        extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_assistant_turn_keeps_its_reasoning_for_the_template() {
        let sent: Vec<ChatMessageIn> = serde_json::from_value(json!([
            {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2", "reasoning": "Easy."},
            {"role": "assistant", "content": "3", "reasoning_content": "Older name."}
        ]))
        .unwrap_or_default();
        let messages = template_messages(&sent).ok().unwrap_or_default();
        let thinking: Vec<Option<&Value>> = messages
            .iter()
            .map(|m| m.extra.get("reasoning_content"))
            .collect();
        assert_eq!(
            thinking,
            [None, Some(&json!("Easy.")), Some(&json!("Older name."))]
        );
        assert_eq!(messages[1].extra.get("thinking"), Some(&json!("Easy.")));
        let from_user: Vec<ChatMessageIn> =
            serde_json::from_value(json!([{"role": "user", "content": "x", "reasoning": "y"}]))
                .unwrap_or_default();
        assert!(template_messages(&from_user).is_err());
    }
}
