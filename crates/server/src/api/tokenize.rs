//! `POST /tokenize` and `POST /detokenize` bodies (vLLM's shapes).

use serde::{Deserialize, Serialize};

use crate::api::chat_request::ChatMessageIn;

/// Either `prompt` (text) or `messages` (rendered with the chat template).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Default: true for `prompt`, false for `messages` (the template adds them).
    pub add_special_tokens: Option<bool>,
    /// Only with `messages`; default true.
    pub add_generation_prompt: Option<bool>,
    pub return_token_strs: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
