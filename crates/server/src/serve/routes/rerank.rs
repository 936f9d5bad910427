//! `POST /v1/rerank` and `POST /rerank`, on a generating server whose model is a
//! Qwen3-Reranker-style reranker: each document is a one-token generation after the
//! reranker's prompt, limited to `yes` and `no`, and its score is `yes`'s probability
//! between the two. A window of documents is in the scheduler at once
//! ([`crate::serve::windowed`]), so they share steps (and the prompt's common prefix in
//! the prefix cache).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::Value;
use tessera_protocol::{FinishReason, SamplingParams, TokenEvent};
use tessera_scheduler::TokenReceiver;

use crate::api::error::ServerError;
use crate::api::rerank::prompt::rerank_prompt;
use crate::api::rerank::reply::rerank_reply;
use crate::api::rerank::request::rerank_request;
use crate::api::valid_request::{blocking, too_long};
use crate::serve::generation::log_ignored_fields;
use crate::serve::json_body::JsonBody;
use crate::serve::state::{random_id, AppState};
use crate::serve::windowed::{no_result, run_windowed, submit_one_step, window};

pub async fn rerank(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ServerError> {
    let req = rerank_request(&body)?;
    log_ignored_fields(&req.ignored);
    app.require_generate()?;
    if let Some(model) = &req.model {
        app.validation.served_model_names.check(model)?;
    }
    let tokenizer = &app.validation.tokenizer;
    let (Some(yes), Some(no)) = (tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")) else {
        return Err(ServerError::invalid(
            "model",
            "this model's vocabulary has no `yes` and `no` tokens: it cannot be a \
             Qwen3-Reranker-style reranker",
        ));
    };
    let prompts = tokenize(&app, &req.query, &req.instruction, &req.documents).await?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let scores = run_windowed(
        prompts,
        window(&app),
        |prompt_ids| {
            let sampling = SamplingParams {
                allowed_token_ids: vec![yes, no],
                logprobs: Some(2),
                ..SamplingParams::greedy()
            };
            submit_one_step(&app, prompt_ids, sampling)
        },
        |receiver| score(receiver, yes),
    )
    .await?;
    Ok(Json(rerank_reply(
        &format!("rerank-{}", random_id()),
        app.model_name(),
        &req.documents,
        &scores,
        req.top_n,
        req.return_documents,
        prompt_tokens,
    )))
}

async fn tokenize(
    app: &AppState,
    query: &str,
    instruction: &str,
    documents: &[String],
) -> Result<Vec<Vec<u32>>, ServerError> {
    let ctx = Arc::clone(&app.validation);
    let texts: Vec<String> = documents
        .iter()
        .map(|d| rerank_prompt(instruction, query, d))
        .collect();
    blocking(&app.validation.work_slots, move || {
        texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                // Room for the one token scored after the prompt.
                let within = ctx.max_model_len.saturating_sub(1);
                ctx.tokenizer
                    .encode_within(text, false, within)
                    .map_err(|e| too_long(e, &format!("documents.{i}"), ctx.max_model_len))
            })
            .collect()
    })
    .await?
}

/// `yes`'s probability between `yes` and `no`: the sampler's log-probabilities are
/// over the tokens it may choose from, here those two.
async fn score(mut receiver: TokenReceiver, yes: u32) -> Result<f64, ServerError> {
    let mut found = None;
    loop {
        match receiver.recv().await {
            Some(TokenEvent::Token { logprobs, .. }) => {
                let lp =
                    logprobs.and_then(|l| l.top.iter().find(|(t, _)| *t == yes).map(|(_, lp)| *lp));
                // `yes` missing from the two: its probability is nil.
                found = Some(lp.map_or(0.0, |lp| f64::from(lp).exp()));
            }
            Some(TokenEvent::Finished {
                reason: FinishReason::Stop | FinishReason::Length,
                ..
            }) => return found.ok_or_else(|| no_result(None, "documents", "a score")),
            other => return Err(no_result(other, "documents", "a score")),
        }
    }
}
