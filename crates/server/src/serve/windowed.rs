//! Requests of many one-step sequences (embeddings of a list of inputs, rerank scores
//! of many documents): a window of them is submitted at once, and each one that ends
//! makes room for the next. One request of 2048 inputs then takes a few of the queue's
//! places (`--max-waiting`) rather than more than it has, and leaves room for others;
//! the engine runs at most `--max-num-seqs` at once anyway.

use std::collections::VecDeque;
use std::future::Future;

use tessera_protocol::{GenerationRequest, SamplingParams, StopCondition, TokenEvent};
use tessera_scheduler::{AdmissionError, TokenReceiver};

use crate::api::error::ServerError;
use crate::serve::state::AppState;

/// Sequences of one request submitted at once: a quarter of the queue, at most 64.
pub fn window(app: &AppState) -> usize {
    (app.scheduler.max_waiting() / 4).clamp(1, 64)
}

/// Submits `prompt_ids` as a sequence of one step: `sampling` decides what that step
/// brings (an embedding, or one token with its log-probabilities).
pub fn submit_one_step(
    app: &AppState,
    prompt_ids: Vec<u32>,
    sampling: SamplingParams,
) -> Result<TokenReceiver, ServerError> {
    let request = GenerationRequest {
        prompt_ids,
        sampling,
        stop: StopCondition {
            max_tokens: 1,
            stop_token_ids: Vec::new(),
            ignore_eos: true,
            request_stop_token_ids: Vec::new(),
        },
        cache_salt: None,
    };
    Ok(app.scheduler.submit(request)?.1)
}

/// Each prompt's result, in order: `submit` sends a prompt to the scheduler, `read`
/// awaits what its receiver brings. The first error ends the request; dropping the
/// receivers still in flight cancels them.
pub async fn run_windowed<T, Fut>(
    prompts: Vec<Vec<u32>>,
    window: usize,
    submit: impl Fn(Vec<u32>) -> Result<TokenReceiver, ServerError>,
    read: impl Fn(TokenReceiver) -> Fut,
) -> Result<Vec<T>, ServerError>
where
    Fut: Future<Output = Result<T, ServerError>>,
{
    let mut results = Vec::with_capacity(prompts.len());
    let mut pending = prompts.into_iter();
    let mut in_flight = VecDeque::with_capacity(window);
    for prompt in pending.by_ref().take(window.max(1)) {
        in_flight.push_back(submit(prompt)?);
    }
    while let Some(receiver) = in_flight.pop_front() {
        results.push(read(receiver).await?);
        if let Some(prompt) = pending.next() {
            in_flight.push_back(submit(prompt)?);
        }
    }
    Ok(results)
}

/// Why a one-step sequence ended with `event` and no result: the engine failed, the
/// sequence failed or was refused (a 400 naming `param`), the server is shutting down,
/// or an event the sequence cannot bring came (`what` names what was awaited).
pub fn no_result(event: Option<TokenEvent>, param: &str, what: &str) -> ServerError {
    match event {
        Some(TokenEvent::Error(message)) => ServerError::EngineFailed(message),
        Some(TokenEvent::Failed(message)) => ServerError::GenerationFailed(message),
        Some(TokenEvent::Refused(message)) => ServerError::invalid(param, message),
        None | Some(TokenEvent::Finished { .. }) => {
            ServerError::Admission(AdmissionError::ShuttingDown)
        }
        Some(TokenEvent::Token { .. } | TokenEvent::Embedding(_)) => {
            ServerError::Internal(format!("an unexpected event came back for {what}"))
        }
    }
}
