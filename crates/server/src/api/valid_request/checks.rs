//! The checks and helpers of request validation: model names, constraint bounds, token
//! ids, bad words, prompt truncation, thinking budgets, and the blocking pool.

use std::sync::Arc;

use tessera_protocol::ThinkingTags;
use tessera_tokenizer::{Tokenizer, TokenizerError};

use super::{ValidPrompt, ValidationContext, WorkSlots};
use crate::api::error::ServerError;
use crate::api::params::spec::{check_in_vocab, GenerationSpec};

/// The token sequences of `bad_words`: each word as it is and, as vLLM does, after a
/// space (how a word inside a sentence is tokenized).
pub(super) fn bad_word_tokens(
    words: &[String],
    tokenizer: &Tokenizer,
) -> Result<Vec<Vec<u32>>, ServerError> {
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
pub(super) fn kept_prompt_tokens(spec: &GenerationSpec, ctx: &ValidationContext) -> Option<usize> {
    spec.truncate_prompt_tokens
        .map(|k| k.unwrap_or(ctx.max_model_len.saturating_sub(1)).max(1))
}

/// The last `keep` of `ids`, when there are more.
pub(super) fn truncated(ids: &[u32], keep: Option<usize>) -> Option<&[u32]> {
    let keep = keep.filter(|k| ids.len() > *k)?;
    Some(&ids[ids.len() - keep..])
}

/// How a constrained reply's thinking block opens and closes in this vocabulary, so its
/// grammar waits for the block to end.
pub(super) fn thinking_tags(tokenizer: &Tokenizer, starts_open: bool) -> ThinkingTags {
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
pub(super) fn check_model(model: &str, ctx: &ValidationContext) -> Result<String, ServerError> {
    ctx.served_model_names.check(model)?;
    Ok(ctx.served_model_names.primary().to_string())
}

/// A constraint over the size and depth bounds is refused before anything else is done
/// for the request; it is compiled once the request is otherwise valid.
pub(super) fn check_constraint_bounds(
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
pub(super) fn budget(
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
