//! `ValidRequest`: the only form of a request the scheduler sees. It is made only by
//! [`ValidRequest::chat`] and [`ValidRequest::completion`], which apply the chat
//! template, tokenize on the blocking pool and check every limit.

mod build;
mod checks;

pub(crate) use checks::{blocking, check_token_ids, too_long};

use std::sync::Arc;

use tessera_protocol::{GenerationRequest, SamplingParams, StopCondition, ThinkingBudget};
use tessera_tokenizer::Tokenizer;

use crate::api::error::ServerError;
use crate::api::models::ServedNames;
use crate::api::params::grammar::GrammarService;
use crate::api::params::limits::RequestLimits;
use crate::api::params::spec::GenerationSpec;
use crate::api::reasoning::{ReasoningParser, ReplySplit};
use crate::api::tools::parsers::ToolParserKind;
use crate::api::tools::prompt::ToolOutput;

/// Default `max_tokens` of `/v1/completions`, as OpenAI's.
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

/// What validation needs to know about the served model.
#[derive(Debug, Clone)]
pub struct ValidationContext {
    pub tokenizer: Arc<Tokenizer>,
    /// The names the model is served under: requests may send any, replies report the
    /// first.
    pub served_model_names: ServedNames,
    /// Longest context (prompt + completion) in tokens.
    pub max_model_len: usize,
    /// Longest context the KV cache holds for one sequence (the whole cache, or no
    /// bound when every layer's attention window keeps a sequence within it); a default
    /// `max_tokens` stays within it.
    pub kv_sequence_tokens: usize,
    /// Rows of the model's token embedding (and of its logits): every prompt token id
    /// and `logit_bias` key is below it, or the request is refused here with a 400
    /// rather than failing in the engine.
    pub vocab_rows: usize,
    /// Limits on `n`, `stop` and `logit_bias`.
    pub limits: RequestLimits,
    /// Compiles constraints (`response_format` and the like), within their bounds.
    pub grammar: GrammarService,
    /// How tool calls are found in free text (`--tool-call-parser`); `None` chooses
    /// from the chat template.
    pub tool_parser: Option<ToolParserKind>,
    /// Whether chat replies are split into thinking and answer (`--reasoning-parser`).
    pub reasoning: ReasoningParser,
    /// Templating and tokenizing running at once, across requests.
    pub work_slots: WorkSlots,
}

/// Bounds how many requests are templated and tokenized at once: that work is CPU-bound
/// and costs memory in proportion to the text, so more at once than there are cores
/// only adds to the peak. Requests beyond wait for a slot.
#[derive(Debug, Clone)]
pub struct WorkSlots(Arc<tokio::sync::Semaphore>);

impl Default for WorkSlots {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self(Arc::new(tokio::sync::Semaphore::new(cores.max(2))))
    }
}

/// A tokenized prompt and its completion budget.
#[derive(Debug, Clone)]
pub struct ValidPrompt {
    pub ids: Vec<u32>,
    /// The prompt text (for `echo`).
    pub text: String,
    pub max_tokens: usize,
}

/// How log-probabilities are returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogprobsShape {
    /// `choices[].logprobs.content[...]`.
    Chat { top: usize },
    /// `choices[].logprobs{tokens, token_logprobs, top_logprobs, text_offset}`.
    Completion { top: usize },
}

/// A request checked against the model: every field usable as is.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    prompts: Vec<ValidPrompt>,
    spec: GenerationSpec,
    stop_token_ids: Vec<u32>,
    logprobs: Option<LogprobsShape>,
    echo: bool,
    /// `max_tokens: 0` with `echo`.
    score_only: bool,
    tool_output: Option<ToolOutput>,
    /// How chat replies are split into thinking and answer, where they are.
    reasoning: Option<ReplySplit>,
}

/// One sequence to submit: its choice index and request.
#[derive(Debug, Clone)]
pub struct PlannedChoice {
    pub index: usize,
    pub prompt_index: usize,
    pub request: GenerationRequest,
}

impl ValidRequest {
    /// How replies are split into thinking and answer, where they are.
    pub fn reasoning(&self) -> Option<ReplySplit> {
        self.reasoning
    }

    /// How the reply's tool calls are read, when it may have any.
    pub fn tool_output(&self) -> Option<&ToolOutput> {
        self.tool_output.as_ref()
    }

    pub fn prompts(&self) -> &[ValidPrompt] {
        &self.prompts
    }
    pub fn stop_strings(&self) -> &[String] {
        &self.spec.stop_strings
    }
    pub fn stream(&self) -> bool {
        self.spec.stream
    }
    pub fn include_usage(&self) -> bool {
        self.spec.include_usage
    }
    pub fn logprobs(&self) -> Option<LogprobsShape> {
        self.logprobs
    }
    pub fn echo(&self) -> bool {
        self.echo
    }
    /// `max_tokens: 0` with `echo`: the reply is the prompt alone; the one token
    /// generated is dropped.
    pub fn score_only(&self) -> bool {
        self.score_only
    }
    pub fn model(&self) -> &str {
        &self.spec.model
    }
    /// The field that asked for the request's constraint.
    pub fn constraint_param(&self) -> &'static str {
        self.spec.constraint_param
    }

    /// When a choice with a budget of `max_tokens` ends, by tokens.
    fn stop_condition(&self, max_tokens: usize) -> StopCondition {
        StopCondition {
            max_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.spec.ignore_eos,
            request_stop_token_ids: self.spec.stop_token_ids.clone(),
        }
    }

    /// The tokens that end a choice (end-of-sequence unless `ignore_eos`, and the
    /// request's own); they are not part of its text unless `include_stop_str_in_output`.
    pub fn stopping_tokens(&self) -> Vec<u32> {
        self.stop_condition(0).stopping_tokens()
    }

    /// Fewer tokens than this cannot be ended by a stop token or stop string.
    pub fn min_tokens(&self) -> usize {
        self.spec.min_tokens
    }

    /// Whether the stop string or token that ended a choice stays in its text.
    pub fn include_stop_str_in_output(&self) -> bool {
        self.spec.include_stop_str_in_output
    }

    /// Whether special tokens are left out of the text.
    pub fn skip_special_tokens(&self) -> bool {
        self.spec.skip_special_tokens
    }

    /// Caps the reply's thinking at `budget` tokens (0: none at all): once spent, the
    /// thinking block's closing tag is forced. Only for replies split at `<think>` tags.
    pub fn limit_thinking(
        &mut self,
        budget: usize,
        ctx: &ValidationContext,
    ) -> Result<(), ServerError> {
        let Some(ReplySplit::Think { open }) = self.reasoning else {
            return Err(ServerError::invalid(
                "thinking",
                "this model's thinking cannot be limited: its replies are not split at \
                 <think> tags",
            ));
        };
        let tags = |text: &str| ctx.tokenizer.encode(text, false);
        self.spec.sampling.thinking_budget = Some(ThinkingBudget {
            tokens: budget,
            open: tags("<think>")?,
            close: tags("</think>")?,
            starts_open: open,
        });
        Ok(())
    }

    /// Compiles the request's constraint, if it has one, once for all its choices.
    async fn prepare_constraint(&mut self, ctx: &ValidationContext) -> Result<(), ServerError> {
        let Some(constraint) = self.spec.sampling.constraint.clone() else {
            return Ok(());
        };
        let first = self.choice_sampling(0);
        let prepared = ctx
            .grammar
            .prepare(&constraint, &first, self.spec.constraint_param)
            .await?;
        self.spec.sampling.prepared_constraint = Some(prepared);
        Ok(())
    }

    /// The sampling parameters of sample `i` of a prompt.
    fn choice_sampling(&self, i: usize) -> SamplingParams {
        let mut sampling = self.spec.sampling.clone();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
        sampling.logprobs = self.logprobs.map(|l| match l {
            LogprobsShape::Chat { top } | LogprobsShape::Completion { top } => top,
        });
        // An echoed prompt is scored too.
        sampling.prompt_logprobs = sampling.logprobs.filter(|_| self.echo);
        if self.spec.min_tokens > 0 {
            sampling.min_tokens = self.spec.min_tokens;
            sampling.min_tokens_blocked = self.stopping_tokens();
        }
        sampling
    }

    /// One generation per choice: prompt `p`, sample `i` is choice `p * n + i`; with a
    /// seed, sample `i` uses `seed + i` so the choices differ but are reproducible. The
    /// choices share one compiled constraint.
    pub fn planned_choices(&self) -> Vec<PlannedChoice> {
        let n = self.spec.n;
        let mut out = Vec::with_capacity(self.prompts.len() * n);
        for (p, prompt) in self.prompts.iter().enumerate() {
            for i in 0..n {
                out.push(PlannedChoice {
                    index: p * n + i,
                    prompt_index: p,
                    request: GenerationRequest {
                        prompt_ids: prompt.ids.clone(),
                        sampling: self.choice_sampling(i),
                        stop: self.stop_condition(prompt.max_tokens),
                        cache_salt: self.spec.cache_salt.clone(),
                    },
                });
            }
        }
        out
    }
}
