//! `POST /tokenize` and `POST /detokenize` bodies (vLLM's shapes).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::api::chat::render::RenderFields;

use crate::api::chat::message::ChatMessageIn;

/// Either `prompt` (text) or `messages` (rendered with the chat template).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Default: true for `prompt`, false for `messages` (the template adds them).
    pub add_special_tokens: Option<bool>,
    /// Only with `messages`; default true (false with `continue_final_message`).
    pub add_generation_prompt: Option<bool>,
    /// Only with `messages`: see [`RenderFields`].
    pub continue_final_message: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Only with `messages`: see [`RenderFields`].
    pub reasoning_effort: Option<Value>,
    /// Only with `messages`: the tools, rendered as a chat completion renders them.
    pub tools: Option<Value>,
    pub return_token_strs: Option<bool>,
}

impl TokenizeRequest {
    /// How `messages` become the text to tokenize.
    pub fn render_fields(&self) -> RenderFields {
        RenderFields {
            chat_template_kwargs: self.chat_template_kwargs.clone(),
            add_generation_prompt: self.add_generation_prompt,
            continue_final_message: self.continue_final_message,
            reasoning_effort: self.reasoning_effort.clone(),
        }
    }
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
