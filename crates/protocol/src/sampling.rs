//! How a sequence chooses its next token and when it stops.

use serde::{Deserialize, Serialize};

use crate::pooling::Pooling;
use crate::prepared::PreparedConstraint;

/// Parameters of the sampler for one sequence. Every field is honoured by the engine's
/// sampler; values are validated by the server before they get here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (arg-max).
    pub temperature: f32,
    /// Keep the `k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set whose probability reaches `top_p`; 1 disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the best one; 0 disables.
    pub min_p: f32,
    /// Fixed seed: the same seed and inputs give the same tokens.
    pub seed: Option<u64>,
    /// OpenAI presence penalty over generated tokens, in [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI frequency penalty over generated tokens, in [-2, 2].
    pub frequency_penalty: f32,
    /// Multiplicative penalty over prompt and generated tokens (1 disables).
    pub repetition_penalty: f32,
    /// Additive bias per token id.
    pub logit_bias: Vec<(u32, f32)>,
    /// Return the chosen token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// Constrained decoding: every token must keep the output a prefix of this format.
    #[serde(default)]
    pub constraint: Option<OutputConstraint>,
    /// `constraint` compiled, once for every sequence of the request, before it was
    /// submitted; a constrained sequence without it is refused by the engine. Stays in
    /// the process that compiled it (the leader, where sequences are sampled).
    #[serde(skip)]
    pub prepared_constraint: Option<PreparedConstraint>,
    /// Also return the log-probability of every prompt token after the first (from the
    /// model's logits at the position before it) with this many alternatives. The whole
    /// prompt is then computed: no prefix-cache hit skips part of it.
    #[serde(default)]
    pub prompt_logprobs: Option<usize>,
    /// The tokens of `min_tokens_blocked` (the sequence's stop tokens) cannot be sampled
    /// until this many tokens have been generated (vLLM's `min_tokens`).
    #[serde(default)]
    pub min_tokens: usize,
    #[serde(default)]
    pub min_tokens_blocked: Vec<u32>,
    /// A reasoning model's thinking block, which the `constraint` does not apply to: the
    /// grammar starts after it.
    #[serde(default)]
    pub thinking: Option<ThinkingTags>,
    /// A cap on a reply's thinking: once that many tokens were generated inside its
    /// thinking block, the block's closing tokens are forced.
    #[serde(default)]
    pub thinking_budget: Option<ThinkingBudget>,
    /// When not empty, the only tokens that may be sampled (vLLM's `allowed_token_ids`).
    #[serde(default)]
    pub allowed_token_ids: Vec<u32>,
    /// Token sequences the output may not contain (vLLM's `bad_words`, tokenized): the
    /// last token of each is masked whenever the output ends with the ones before it.
    #[serde(default)]
    pub bad_words: Vec<Vec<u32>>,
    /// An embedding sequence: after its prompt, its pooled final hidden states come back
    /// ([`crate::SampledToken::embedding`]) and nothing is sampled or generated.
    #[serde(default)]
    pub pooling: Option<Pooling>,
}

/// How a reply's thinking block is opened and closed, in tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinkingTags {
    /// The token that opens a block as the reply's first token, when `<think>` is one
    /// token; without it a reply that does not start inside a block never thinks.
    pub open: Option<u32>,
    /// The text that closes the block (`</think>`), however the reply's tokens spell it.
    pub close: String,
    /// The prompt opened the block: the reply starts inside it.
    pub starts_open: bool,
}

/// How many tokens a reply may think for, and the tokens that open and close its
/// thinking block in this vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinkingBudget {
    /// Tokens the block may hold before it is closed (0: closed at once).
    pub tokens: usize,
    /// The tokens of the opening tag (`<think>`).
    pub open: Vec<u32>,
    /// The tokens of the closing tag (`</think>`), forced once the budget is spent.
    pub close: Vec<u32>,
    /// The prompt opened the block: the reply starts inside it.
    pub starts_open: bool,
}

/// A format the output must follow, enforced token by token by masking the logits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputConstraint {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A value valid under this JSON schema, given as JSON text (`json_schema`).
    JsonSchema { schema: String },
    /// Text the whole of which matches this regular expression (Rust `regex` syntax).
    Regex { pattern: String },
    /// Exactly one of these strings.
    Choice { choices: Vec<String> },
    /// Text in the language of this grammar, in llguidance's Lark syntax.
    Grammar { lark: String },
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            logprobs: None,
            constraint: None,
            prepared_constraint: None,
            prompt_logprobs: None,
            min_tokens: 0,
            min_tokens_blocked: Vec::new(),
            thinking: None,
            thinking_budget: None,
            allowed_token_ids: Vec::new(),
            bad_words: Vec::new(),
            pooling: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with every other option off.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// True when the arg-max is taken (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// Token-level stop rules, checked by the scheduler after every sampled token.
/// Stop *strings* are text-level and matched by the server after detokenizing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopCondition {
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// End-of-sequence tokens: they end the sequence unless `ignore_eos`.
    pub stop_token_ids: Vec<u32>,
    /// Keep going past end-of-sequence tokens until `max_tokens`.
    pub ignore_eos: bool,
    /// The request's own stop tokens (vLLM's `stop_token_ids`): they end the sequence
    /// even with `ignore_eos`.
    #[serde(default)]
    pub request_stop_token_ids: Vec<u32>,
}

impl StopCondition {
    /// Whether sampling `token` ends the sequence.
    pub fn stops_at(&self, token: u32) -> bool {
        (!self.ignore_eos && self.stop_token_ids.contains(&token))
            || self.request_stop_token_ids.contains(&token)
    }

    /// The tokens that end the sequence.
    pub fn stopping_tokens(&self) -> Vec<u32> {
        let eos = self.stop_token_ids.iter().filter(|_| !self.ignore_eos);
        let mut all: Vec<u32> = eos.chain(&self.request_stop_token_ids).copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// Why a sequence ended, with OpenAI's names where they exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token or stop string was produced.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The request was cancelled (client gone) or the server is shutting down.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// A generation the scheduler can run: a tokenized prompt and how to continue it.
/// The server builds it only from a validated request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRequest {
    pub prompt_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopCondition,
    /// Prefix-cache isolation (vLLM's `cache_salt`): cached blocks are shared only
    /// between requests with the same salt (or none).
    #[serde(default)]
    pub cache_salt: Option<String>,
}
