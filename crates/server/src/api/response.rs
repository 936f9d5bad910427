//! Response bodies in OpenAI's shapes: completions, stream chunks, usage, logprobs.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Of the prompt's tokens, those the prefix cache held (OpenAI's
    /// `prompt_tokens_details.cached_tokens`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// With `cached_tokens` of the prompt found in the prefix cache.
    pub fn with_cached(mut self, cached_tokens: usize) -> Self {
        self.prompt_tokens_details = Some(PromptTokensDetails { cached_tokens });
        self
    }

    /// The prompt's tokens the prefix cache held.
    pub fn cached_tokens(&self) -> usize {
        self.prompt_tokens_details.map_or(0, |d| d.cached_tokens)
    }
}

/// The log-probability of one generated token, route-neutral.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// Most likely alternatives, best first.
    pub top: Vec<(String, f32)>,
}

// ---- chat ----

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the reply is only tool calls.
    pub content: Option<String>,
    /// The model's thinking, when the reply is split (see `reasoning`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A model's thinking under both names clients read: `reasoning` (vLLM's, OpenAI's
/// guidance) and `reasoning_content` (DeepSeek's, llama.cpp's).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reasoning {
    pub reasoning: String,
    pub reasoning_content: String,
}

impl Reasoning {
    /// `None` for no thinking.
    pub fn of(text: String) -> Option<Self> {
        (!text.is_empty()).then(|| Reasoning {
            reasoning_content: text.clone(),
            reasoning: text,
        })
    }
}

/// A call the model made: `{"id": "call_...", "type": "function", "function": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text of the arguments object.
    pub arguments: String,
}

/// A streamed piece of a call: the first carries `id`, `type` and the name, later ones
/// argument text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    pub fn from_tokens(tokens: &[TokenLogprob]) -> Self {
        ChatLogprobs {
            content: tokens
                .iter()
                .map(|t| ChatTokenLogprob {
                    token: t.token.clone(),
                    logprob: t.logprob,
                    bytes: t.token.as_bytes().to_vec(),
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|(token, logprob)| ChatTopLogprob {
                            token: token.clone(),
                            logprob: *logprob,
                            bytes: token.as_bytes().to_vec(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

// ---- text completions ----

#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// `null` for an echoed prompt's first token, which nothing scores.
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Character offset of each token's text in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Append `tokens`, whose text starts at character `offset` of the choice; returns
    /// the offset after them.
    pub fn extend(&mut self, tokens: &[TokenLogprob], mut offset: usize) -> usize {
        for t in tokens {
            self.tokens.push(t.token.clone());
            self.token_logprobs.push(Some(t.logprob));
            self.top_logprobs
                .push(Some(t.top.iter().cloned().collect()));
            self.text_offset.push(offset);
            offset += t.token.chars().count();
        }
        offset
    }

    /// Append a token nothing scores (an echoed prompt's first); returns the offset
    /// after it.
    pub fn push_unscored(&mut self, token: String, offset: usize) -> usize {
        let next = offset + token.chars().count();
        self.tokens.push(token);
        self.token_logprobs.push(None);
        self.top_logprobs.push(None);
        self.text_offset.push(offset);
        next
    }
}
