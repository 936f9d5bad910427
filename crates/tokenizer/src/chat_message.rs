//! `ChatMessage`: one message of an OpenAI-style conversation, and how its content is
//! handed to a chat template.
//!
//! OpenAI clients send `content` either as a string or as a list of parts
//! (`[{"type": "text", "text": "..."}]`). Most templates only handle strings, so for those
//! ([`ContentFormat::String`]) the text parts are joined with `"\n"` into one string; a
//! template that inspects parts itself ([`ContentFormat::Parts`]) gets the list unchanged.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Result, TokenizerError};

/// A message: `role`, optional `content`, and any other fields (`name`, `tool_calls`,
/// `tool_call_id`, `reasoning_content`, ...) passed to the template as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message with string content and no other fields.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            extra: Map::new(),
        }
    }

    /// The JSON object the template sees as one entry of `messages`.
    pub(crate) fn to_template_value(&self, format: ContentFormat) -> Result<Value> {
        let mut object = Map::new();
        object.insert("role".to_string(), Value::String(self.role.clone()));
        let content = match (&self.content, format) {
            (None, _) => Value::Null,
            (Some(MessageContent::Text(text)), _) => Value::String(text.clone()),
            (Some(MessageContent::Parts(parts)), ContentFormat::Parts) => {
                Value::Array(parts.clone())
            }
            (Some(MessageContent::Parts(parts)), ContentFormat::String) => {
                Value::String(join_text_parts(parts)?)
            }
        };
        object.insert("content".to_string(), content);
        for (key, value) in &self.extra {
            if key != "role" && key != "content" {
                object.insert(key.clone(), value.clone());
            }
        }
        Ok(Value::Object(object))
    }
}

/// Message content: a string or a list of typed parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<Value>),
}

/// What a template expects in `message.content`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// A plain string: text parts are joined before rendering.
    String,
    /// The OpenAI list of parts, as sent.
    Parts,
}

impl ContentFormat {
    /// Guesses from the template source: a template that tests the type of `content`
    /// (`content is string`), iterates over it (`for part in message.content`) or reads a
    /// part's `type` handles lists itself; any other template gets strings.
    pub fn detect(source: &str) -> Self {
        // Normalise `x['content']` / `x["content"]` to `x.content` and collapse whitespace,
        // so one set of patterns covers the common spellings.
        let normalised = source
            .replace("['content']", ".content")
            .replace("[\"content\"]", ".content")
            .replace("['type']", ".type")
            .replace("[\"type\"]", ".type");
        let normalised = normalised.split_whitespace().collect::<Vec<_>>().join(" ");
        let tests_type = ["string", "iterable", "sequence", "mapping"]
            .iter()
            .any(|test| {
                normalised.contains(&format!("content is {test}"))
                    || normalised.contains(&format!("content is not {test}"))
            });
        let iterates = normalised.split(" in ").skip(1).any(|after| {
            let operand = after.split([' ', '%', '|', ')']).next().unwrap_or_default();
            operand.ends_with(".content")
        });
        let reads_parts = normalised.contains(".content[0]") || normalised.contains(".type ==");
        if tests_type || iterates || reads_parts {
            ContentFormat::Parts
        } else {
            ContentFormat::String
        }
    }
}

fn join_text_parts(parts: &[Value]) -> Result<String> {
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("text");
        if kind != "text" {
            return Err(TokenizerError::TemplateInput(format!(
                "content part of type `{kind}` is not supported by this model's template"
            )));
        }
        let text = part.get("text").and_then(Value::as_str).ok_or_else(|| {
            TokenizerError::TemplateInput("text content part has no `text` string".to_string())
        })?;
        texts.push(text);
    }
    Ok(texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_content_format() {
        let chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
        assert_eq!(ContentFormat::detect(chatml), ContentFormat::String);
        let qwen = "{%- if message.content is string %}{{ message.content }}{%- endif %}";
        assert_eq!(ContentFormat::detect(qwen), ContentFormat::Parts);
        let loops = "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}";
        assert_eq!(ContentFormat::detect(loops), ContentFormat::Parts);
    }

    #[test]
    fn parts_join_to_string() {
        let message: ChatMessage = serde_json::from_value(serde_json::json!({
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "name": "bob"
        }))
        .unwrap();
        let value = message.to_template_value(ContentFormat::String).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"role": "user", "content": "a\nb", "name": "bob"})
        );
        let kept = message.to_template_value(ContentFormat::Parts).unwrap();
        assert!(kept["content"].is_array());
        let image: ChatMessage = serde_json::from_value(serde_json::json!({
            "role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]
        }))
        .unwrap();
        assert!(image.to_template_value(ContentFormat::String).is_err());
    }
}
