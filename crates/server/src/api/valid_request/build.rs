//! Making a [`ValidRequest`] from a chat or completions request: the template applied
//! and the prompt tokenized on the blocking pool, every parameter and limit checked.

use std::sync::Arc;

use tessera_tokenizer::TokenizerError;

use super::checks::{
    bad_word_tokens, blocking, budget, check_constraint_bounds, check_model, check_token_ids,
    kept_prompt_tokens, thinking_tags, too_long, truncated,
};
use super::{
    LogprobsShape, ValidPrompt, ValidRequest, ValidationContext, DEFAULT_COMPLETION_MAX_TOKENS,
};
use crate::api::chat::render::template_error;
use crate::api::chat::request::ChatRequest;
use crate::api::completions::infill::requested_suffix;
use crate::api::completions::request::{CompletionRequest, PromptInput};
use crate::api::error::ServerError;
use crate::api::params::spec::{check_top_logprobs, GenerationSpec};
use crate::api::reasoning::ReplySplit;
use crate::api::tools::prompt::adapt_to_template;

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
}
