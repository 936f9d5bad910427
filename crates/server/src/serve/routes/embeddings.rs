//! `POST /v1/embeddings`, on a server started with `--runner pooling`: each input is a
//! prefill-only sequence in the same scheduler as generation (batched with the others,
//! its KV freed when its embedding is made), pooled as the model's setup says; a window
//! of a request's inputs is submitted at once ([`crate::serve::windowed`]).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::Value;
use tessera_protocol::{FinishReason, SamplingParams, TokenEvent};
use tessera_scheduler::TokenReceiver;

use crate::api::embeddings::reply::{embeddings_reply, truncate};
use crate::api::embeddings::request::{embeddings_request, EmbeddingInput};
use crate::api::error::ServerError;
use crate::api::valid_request::{blocking, check_token_ids, too_long};
use crate::runner::PoolingSetup;
use crate::serve::generation::{log_end_user, log_ignored_fields};
use crate::serve::json_body::JsonBody;
use crate::serve::state::AppState;
use crate::serve::windowed::{no_result, run_windowed, submit_one_step, window};

pub async fn create_embeddings(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ServerError> {
    let req = embeddings_request(&body)?;
    log_end_user(req.user.as_ref());
    log_ignored_fields(&req.ignored);
    let setup = app.require_pooling()?.clone();
    app.validation.served_model_names.check(&req.model)?;
    let width = match req.dimensions {
        Some(d) => Some(check_dimensions(&setup, d)?),
        None => None,
    };
    let prompts = tokenize(&app, req.inputs).await?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    // A window of inputs is in the scheduler at once, so they share steps; dropping the
    // receivers (a client that left) cancels the rest.
    let vectors = run_windowed(
        prompts,
        window(&app),
        |prompt_ids| {
            let sampling = SamplingParams {
                pooling: Some(setup.pooling),
                ..SamplingParams::greedy()
            };
            submit_one_step(&app, prompt_ids, sampling)
        },
        embedding,
    )
    .await?;
    let vectors: Vec<Vec<f32>> = vectors
        .into_iter()
        .map(|v| match width {
            Some(w) => truncate(v, w, setup.pooling.normalize),
            None => v,
        })
        .collect();
    Ok(Json(embeddings_reply(
        app.model_name(),
        &vectors,
        req.format,
        prompt_tokens,
    )))
}

/// `dimensions`, where the model was trained for it.
fn check_dimensions(setup: &PoolingSetup, d: usize) -> Result<usize, ServerError> {
    let refuse = |why: String| Err(ServerError::invalid("dimensions", why));
    match &setup.matryoshka {
        None => refuse(format!(
            "this model's embeddings cannot be shortened: it was not trained for widths \
             other than its own {} (no Matryoshka dimensions in its config.json)",
            setup.hidden_size
        )),
        Some(_) if d > setup.hidden_size => refuse(format!(
            "`dimensions` is {d}, more than the model's {}",
            setup.hidden_size
        )),
        Some(widths) if !widths.is_empty() && !widths.contains(&d) => refuse(format!(
            "`dimensions` must be one of the model's widths {widths:?}"
        )),
        Some(_) => Ok(d),
    }
}

/// Every input's token ids, with the tokenizer's special tokens (an embedder's last
/// token pooling reads the end-of-text token its tokenizer appends).
async fn tokenize(
    app: &AppState,
    inputs: Vec<EmbeddingInput>,
) -> Result<Vec<Vec<u32>>, ServerError> {
    let ctx = Arc::clone(&app.validation);
    let max_model_len = ctx.max_model_len;
    let many = inputs.len() > 1;
    blocking(&app.validation.work_slots, move || {
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let param = if many {
                    format!("input.{i}")
                } else {
                    "input".to_string()
                };
                let ids = match input {
                    EmbeddingInput::Text(text) => ctx
                        .tokenizer
                        .encode_within(&text, true, max_model_len)
                        .map_err(|e| too_long(e, &param, max_model_len))?,
                    EmbeddingInput::Tokens(ids) => {
                        check_token_ids(&ids, &param, &ctx)?;
                        ids
                    }
                };
                // The scheduler reserves room for one token after every prompt.
                if ids.len() >= max_model_len {
                    return Err(ServerError::invalid(
                        &param,
                        format!(
                            "`{param}` is {} tokens; the model's context length is \
                             {max_model_len}",
                            ids.len()
                        ),
                    ));
                }
                if ids.is_empty() {
                    return Err(ServerError::invalid(
                        &param,
                        format!("`{param}` has no tokens"),
                    ));
                }
                Ok(ids)
            })
            .collect()
    })
    .await?
}

/// The embedding `receiver` brings, or why none came.
async fn embedding(mut receiver: TokenReceiver) -> Result<Vec<f32>, ServerError> {
    let mut vector = None;
    loop {
        match receiver.recv().await {
            Some(TokenEvent::Embedding(v)) => vector = Some(v),
            Some(TokenEvent::Finished {
                reason: FinishReason::Stop | FinishReason::Length,
                ..
            }) => return vector.ok_or_else(|| no_result(None, "input", "an embedding")),
            other => return Err(no_result(other, "input", "an embedding")),
        }
    }
}
