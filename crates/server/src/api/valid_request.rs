//! `ValidRequest`: the only form of a request the scheduler sees. It is made only by
//! [`ValidRequest::chat`] and [`ValidRequest::completion`], which apply the chat
//! template, tokenize on the blocking pool and check every limit.

use std::sync::Arc;

use tessera_protocol::{
    GenerationRequest, SamplingParams, StopCondition, ThinkingBudget, ThinkingTags,
};
use tessera_tokenizer::{Tokenizer, TokenizerError};

use crate::api::chat::render::template_error;
use crate::api::chat::request::ChatRequest;
use crate::api::completions::infill::requested_suffix;
use crate::api::completions::request::{CompletionRequest, PromptInput};
use crate::api::error::ServerError;
use crate::api::models::ServedNames;
use crate::api::params::grammar::GrammarService;
use crate::api::params::limits::RequestLimits;
use crate::api::params::spec::{check_in_vocab, check_top_logprobs, GenerationSpec};
use crate::api::reasoning::{ReasoningParser, ReplySplit};
use crate::api::tools::parsers::ToolParserKind;
use crate::api::tools::prompt::{adapt_to_template, ToolOutput};

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
    pub async fn chat(req: ChatRequest, ctx: &ValidationContext) -> Result<Self, ServerError> {
        let mut spec = GenerationSpec::from_params(&req.params, ctx.vocab_rows, &ctx.limits)?;
        spec.sampling.bad_words = bad_word_tokens(&spec.bad_words, &ctx.tokenizer)?;
        spec.model = check_model(&spec.model, ctx)?;
        let tools = req.tool_request()?;
        if let Some(forced) = tools.as_ref().and_then(|t| t.forced_constraint()) {
            if spec.sampling.constraint.is_some() {
                return Err(ServerError::invalid(
                    "tool_choice",
                    format!(
                        "`tool_choice` \"required\" or a named function cannot be combined \
                         with `{}`",
                        spec.constraint_param
                    ),
                ));
            }
            spec.constrain(forced, "tools")?;
        }
        check_constraint_bounds(&spec, ctx)?;
        let logprobs = match (req.chat.logprobs, req.chat.top_logprobs) {
            (Some(true), top) => Some(LogprobsShape::Chat {
                top: check_top_logprobs("top_logprobs", top.unwrap_or(0))?,
            }),
            (_, Some(_)) => {
                return Err(ServerError::invalid(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs`: true",
                ))
            }
            _ => None,
        };
        // Every template writes each message with at least a role marker: more messages
        // than the context has tokens cannot fit, whatever they hold.
        if req.chat.messages.len() >= ctx.max_model_len {
            return Err(ServerError::invalid(
                "messages",
                format!(
                    "{} messages cannot fit the model's context length of {} tokens",
                    req.chat.messages.len(),
                    ctx.max_model_len
                ),
            ));
        }
        let messages = req.template_messages()?;
        let render = req.render.check(&req.chat.messages)?;
        let tokenizer = Arc::clone(&ctx.tokenizer);
        let parser_flag = ctx.tool_parser;
        let reasoning = ctx.reasoning;
        let keep = kept_prompt_tokens(&spec, ctx);
        let max_model_len = ctx.max_model_len;
        let max_prompt = max_model_len.saturating_sub(1);
        let (text, ids, tool_output, split) = blocking(&ctx.work_slots, move || {
            let template = tokenizer.chat_template().map_err(template_error)?;
            render.check_template(template.source())?;
            let (messages, template_tools, tool_output) =
                adapt_to_template(messages, tools.as_ref(), template.source(), parser_flag);
            let text = template
                .render(&render.request(messages, template_tools))
                .map_err(template_error)?;
            let text = render.prompt(text)?;
            let split = reasoning.reply_split(template.source(), &text);
            let ids = match keep {
                Some(keep) => tokenizer.encode_tail(&text, false, keep)?,
                None => tokenizer
                    .encode_within(&text, false, max_prompt)
                    .map_err(|e| too_long(e, "messages", max_model_len))?,
            };
            Ok::<_, ServerError>((text, ids, tool_output, split))
        })
        .await??;
        check_token_ids(&ids, "messages", ctx)?;
        let prompt = budget(ids, text, spec.max_tokens, None, "messages", ctx)?;
        let mut valid = Self::assemble(vec![prompt], spec, logprobs, false, ctx);
        valid.tool_output = tool_output;
        valid.reasoning = split;
        // A constraint waits for a `<think>` block to close; with harmony channels it
        // applies from the reply's first token.
        if let Some(ReplySplit::Think { open }) =
            split.filter(|_| valid.spec.sampling.constraint.is_some())
        {
            valid.spec.sampling.thinking = Some(thinking_tags(&ctx.tokenizer, open));
        }
        valid.prepare_constraint(ctx).await?;
        Ok(valid)
    }

    pub async fn completion(
        mut req: CompletionRequest,
        ctx: &ValidationContext,
    ) -> Result<Self, ServerError> {
        // `max_tokens: 0` with `echo`: the prompt alone, scored when `logprobs` asks (as
        // OpenAI's legacy completions allowed). One token is generated and dropped: the
        // last prompt position's logits are made anyway.
        let echo = req.completion.echo.unwrap_or(false);
        let score_only =
            echo && req.params.max_completion_tokens.or(req.params.max_tokens) == Some(0);
        if score_only {
            req.params.max_completion_tokens = None;
            req.params.max_tokens = Some(1);
        }
        let mut spec = GenerationSpec::from_params(&req.params, ctx.vocab_rows, &ctx.limits)?;
        spec.sampling.bad_words = bad_word_tokens(&spec.bad_words, &ctx.tokenizer)?;
        spec.model = check_model(&spec.model, ctx)?;
        check_constraint_bounds(&spec, ctx)?;
        let logprobs = match req.completion.logprobs {
            Some(top) => Some(LogprobsShape::Completion {
                top: check_top_logprobs("logprobs", top)?,
            }),
            None => None,
        };
        if score_only && spec.stream {
            return Err(ServerError::invalid(
                "max_tokens",
                "`max_tokens: 0` (the echoed prompt alone) is supported without `stream` only",
            ));
        }
        let suffix = requested_suffix(&req, &spec, &ctx.tokenizer)?;
        let infill = suffix.is_some();
        let inputs = req.prompts()?;
        let max_choices = ctx.limits.max_choices;
        if inputs.len().saturating_mul(spec.n) > max_choices {
            return Err(ServerError::invalid(
                "n",
                format!(
                    "{} prompts times n = {} is more than {max_choices} choices",
                    inputs.len(),
                    spec.n
                ),
            ));
        }
        for input in &inputs {
            if let PromptInput::Ids(ids) = input {
                check_token_ids(ids, "prompt", ctx)?;
            }
        }
        let tokenizer = Arc::clone(&ctx.tokenizer);
        let keep = kept_prompt_tokens(&spec, ctx);
        let max_model_len = ctx.max_model_len;
        let max_prompt = max_model_len.saturating_sub(1);
        let tokenized = blocking(&ctx.work_slots, move || {
            inputs
                .into_iter()
                .map(|p| {
                    let ids = match p {
                        PromptInput::Text(text) => {
                            if let Some(suffix) = &suffix {
                                let bound =
                                    max_prompt.saturating_mul(tokenizer.max_bytes_per_token());
                                if text.len() + suffix.len() > bound {
                                    return Err(TokenizerError::TooLong {
                                        max_tokens: max_prompt,
                                    });
                                }
                                let ids = tokenizer.encode_infill(&text, suffix)?;
                                return Ok((text, ids));
                            }
                            match keep {
                                None => {
                                    let ids = tokenizer.encode_within(&text, true, max_prompt)?;
                                    return Ok((text, ids));
                                }
                                Some(keep) => tokenizer.encode_tail(&text, true, keep)?,
                            }
                        }
                        PromptInput::Ids(ids) => truncated(&ids, keep).unwrap_or(&ids).to_vec(),
                    };
                    // The echoed prompt is the text of the tokens that were kept.
                    Ok((tokenizer.decode(&ids, false)?, ids))
                })
                .collect::<Result<Vec<_>, TokenizerError>>()
        })
        .await?
        .map_err(|e| too_long(e, "prompt", max_model_len))?;
        let mut prompts = Vec::with_capacity(tokenized.len());
        for (text, ids) in tokenized {
            check_token_ids(&ids, "prompt", ctx)?;
            prompts.push(budget(
                ids,
                text,
                spec.max_tokens,
                Some(DEFAULT_COMPLETION_MAX_TOKENS),
                "prompt",
                ctx,
            )?);
        }
        let mut valid = Self::assemble(prompts, spec, logprobs, echo, ctx);
        valid.score_only = score_only;
        if infill {
            valid.stop_token_ids.extend(ctx.tokenizer.infill_end_ids());
            valid.stop_token_ids.sort_unstable();
            valid.stop_token_ids.dedup();
        }
        valid.prepare_constraint(ctx).await?;
        Ok(valid)
    }

    fn assemble(
        prompts: Vec<ValidPrompt>,
        spec: GenerationSpec,
        logprobs: Option<LogprobsShape>,
        echo: bool,
        ctx: &ValidationContext,
    ) -> Self {
        ValidRequest {
            prompts,
            spec,
            stop_token_ids: ctx.tokenizer.eos_token_ids().to_vec(),
            logprobs,
            echo,
            score_only: false,
            tool_output: None,
            reasoning: None,
        }
    }

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

/// The token sequences of `bad_words`: each word as it is and, as vLLM does, after a
/// space (how a word inside a sentence is tokenized).
fn bad_word_tokens(words: &[String], tokenizer: &Tokenizer) -> Result<Vec<Vec<u32>>, ServerError> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    for word in words {
        let spaced = format!(" {}", word.trim_start());
        for text in [word.as_str(), spaced.as_str()] {
            let ids = tokenizer.encode(text, false)?;
            if !ids.is_empty() && !out.contains(&ids) {
                out.push(ids);
            }
        }
    }
    Ok(out)
}

/// How many prompt tokens `truncate_prompt_tokens` keeps, if it is set.
fn kept_prompt_tokens(spec: &GenerationSpec, ctx: &ValidationContext) -> Option<usize> {
    spec.truncate_prompt_tokens
        .map(|k| k.unwrap_or(ctx.max_model_len.saturating_sub(1)).max(1))
}

/// The last `keep` of `ids`, when there are more.
fn truncated(ids: &[u32], keep: Option<usize>) -> Option<&[u32]> {
    let keep = keep.filter(|k| ids.len() > *k)?;
    Some(&ids[ids.len() - keep..])
}

/// How a constrained reply's thinking block opens and closes in this vocabulary, so its
/// grammar waits for the block to end.
fn thinking_tags(tokenizer: &Tokenizer, starts_open: bool) -> ThinkingTags {
    ThinkingTags {
        open: tokenizer.token_to_id("<think>"),
        close: "</think>".to_string(),
        starts_open,
    }
}

/// A text that cannot fit the context is the client's error, naming `param`.
pub(crate) fn too_long(e: TokenizerError, param: &str, max_model_len: usize) -> ServerError {
    match e {
        TokenizerError::TooLong { .. } => ServerError::invalid(
            param,
            format!(
                "the prompt is longer than the model's context length of {max_model_len} \
                 tokens (it must leave room for at least one generated token)"
            ),
        ),
        other => other.into(),
    }
}

/// Every token id must have a row in the model's embedding (and in the tokenizer, to
/// be decoded): the smaller of the two bounds them.
pub(crate) fn check_token_ids(
    ids: &[u32],
    param: &str,
    ctx: &ValidationContext,
) -> Result<(), ServerError> {
    check_in_vocab(param, ids, ctx.vocab_rows.min(ctx.tokenizer.vocab_size()))
}

/// The name replies report (the first served name, as vLLM reports it), if `model` is
/// one of the served names.
fn check_model(model: &str, ctx: &ValidationContext) -> Result<String, ServerError> {
    ctx.served_model_names.check(model)?;
    Ok(ctx.served_model_names.primary().to_string())
}

/// A constraint over the size and depth bounds is refused before anything else is done
/// for the request; it is compiled once the request is otherwise valid.
fn check_constraint_bounds(
    spec: &GenerationSpec,
    ctx: &ValidationContext,
) -> Result<(), ServerError> {
    match &spec.sampling.constraint {
        Some(c) => ctx.grammar.check_bounds(c, spec.constraint_param),
        None => Ok(()),
    }
}

/// Check the prompt against the context and settle `max_tokens` (default: `default`,
/// else the rest of the context).
fn budget(
    ids: Vec<u32>,
    text: String,
    requested: Option<usize>,
    default: Option<usize>,
    prompt_param: &str,
    ctx: &ValidationContext,
) -> Result<ValidPrompt, ServerError> {
    let limit = ctx.max_model_len;
    let prompt_len = ids.len();
    if prompt_len == 0 {
        return Err(ServerError::invalid(
            prompt_param,
            "the prompt has no tokens",
        ));
    }
    if prompt_len >= limit {
        return Err(ServerError::invalid(
            prompt_param,
            format!(
                "the prompt is {prompt_len} tokens but the model's context length is \
                 {limit} tokens (it must leave room for at least one generated token)"
            ),
        ));
    }
    let room = limit - prompt_len;
    let max_tokens = match requested {
        Some(m) if m > room => {
            return Err(ServerError::invalid(
                "max_tokens",
                format!(
                    "the prompt is {prompt_len} tokens and max_tokens is {m}: together more \
                     than the model's context length of {limit} tokens"
                ),
            ))
        }
        Some(m) => m,
        // The default must fit the KV cache too, or the request could never run.
        None => {
            let fits = ctx.kv_sequence_tokens.saturating_sub(prompt_len).max(1);
            default.map_or(room, |d| d.min(room)).min(fits)
        }
    };
    Ok(ValidPrompt {
        ids,
        text,
        max_tokens,
    })
}

/// Run CPU-heavy work (templating, tokenizing) on the blocking pool, in one of `slots`.
pub(crate) async fn blocking<T: Send + 'static>(
    slots: &WorkSlots,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ServerError> {
    let slot = Arc::clone(&slots.0)
        .acquire_owned()
        .await
        .map_err(|_| ServerError::Internal("the validation slots were closed".into()))?;
    // The slot is free once the work ends, even if the request stopped waiting for it.
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        f()
    })
    .await
    .map_err(|e| ServerError::Internal(format!("blocking task failed: {e}")))
}
