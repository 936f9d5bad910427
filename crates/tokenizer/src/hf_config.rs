//! The parts of Hugging Face's `tokenizer_config.json` and `generation_config.json` that
//! tokenization and chat rendering need.
//!
//! Both files are read leniently: unknown fields are ignored, and special tokens may be
//! written as a string or as an added-token object (`{"content": "<s>", ...}`), as
//! transformers accepts both.

use std::path::Path;

use serde_json::Value;

use crate::error::{Result, TokenizerError};

/// Settings from `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HfTokenizerConfig {
    /// `chat_template`: a string, or the entry named `default` of a list of named templates.
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    /// `add_bos_token` (Llama-style slow tokenizers); the tokenizer.json post-processor is
    /// what actually adds tokens, this is kept for information.
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// `clean_up_tokenization_spaces`: transformers removes spaces before punctuation in
    /// `decode` when set.
    pub clean_up_tokenization_spaces: bool,
}

impl HfTokenizerConfig {
    /// Reads and parses `tokenizer_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let value = read_json(path)?;
        Ok(Self::from_json(&value))
    }

    /// Parses an already-loaded `tokenizer_config.json`.
    pub fn from_json(value: &Value) -> Self {
        HfTokenizerConfig {
            chat_template: chat_template(value.get("chat_template")),
            bos_token: token_text(value.get("bos_token")),
            eos_token: token_text(value.get("eos_token")),
            unk_token: token_text(value.get("unk_token")),
            pad_token: token_text(value.get("pad_token")),
            add_bos_token: value.get("add_bos_token").and_then(Value::as_bool),
            add_eos_token: value.get("add_eos_token").and_then(Value::as_bool),
            clean_up_tokenization_spaces: value
                .get("clean_up_tokenization_spaces")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }
}

/// `eos_token_id` of `generation_config.json`: one id or a list.
pub fn generation_eos_ids(path: &Path) -> Result<Vec<u32>> {
    let value = read_json(path)?;
    let ids = match value.get("eos_token_id") {
        Some(Value::Array(items)) => items.iter().filter_map(as_u32).collect(),
        Some(single) => as_u32(single).into_iter().collect(),
        None => Vec::new(),
    };
    Ok(ids)
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| TokenizerError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn as_u32(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|v| u32::try_from(v).ok())
}

fn token_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn chat_template(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        // transformers' list form: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        Value::Array(items) => items
            .iter()
            .find(|item| item.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|item| item.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_as_strings_or_objects() {
        let json = serde_json::json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
            "clean_up_tokenization_spaces": true
        });
        let config = HfTokenizerConfig::from_json(&json);
        assert_eq!(config.bos_token.as_deref(), Some("<s>"));
        assert_eq!(config.eos_token.as_deref(), Some("</s>"));
        assert_eq!(config.chat_template.as_deref(), Some("D"));
        assert!(config.clean_up_tokenization_spaces);
        assert_eq!(config.pad_token, None);
    }
}
