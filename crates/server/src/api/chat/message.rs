//! One chat message as a client sends it, before validation turns it into what the
//! chat template takes.

use serde::Deserialize;
use serde_json::Value;

/// One message as sent.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    pub content: Option<Value>,
    pub name: Option<String>,
    pub tool_calls: Option<Value>,
    pub tool_call_id: Option<String>,
    /// An assistant turn's thinking, as a reply gave it (`reasoning`, or the older
    /// `reasoning_content`); templates read it as `reasoning_content` (Qwen3) or `thinking` (gpt-oss).
    pub reasoning: Option<String>,
    pub reasoning_content: Option<String>,
}
