//! Running the choices of a [`ValidRequest`]: submit every sequence before any response
//! starts (so refusals are plain HTTP errors), then turn each sequence's token events
//! into text deltas with incremental detokenizing and stop-string matching.
//!
//! Each [`ChoiceRun`] owns its scheduler receiver; dropping the run (a stop string hit,
//! the client gone, another choice failed) drops the receiver and so cancels the
//! sequence, whose KV blocks the scheduler frees in its next step.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::try_join_all;
use tessera_protocol::{FinishReason, TokenEvent, TokenLogprobs};
use tessera_scheduler::AdmissionError;
use tessera_scheduler::TokenReceiver;
use tessera_tokenizer::{IncrementalDecoder, StopMatcher, Tokenizer};

use crate::api::error::ServerError;
use crate::api::reasoning::harmony::KEPT_MARKERS;
use crate::api::reasoning::ReplySplit;
use crate::api::reasoning::THINK_MARKERS;
use crate::api::response::TokenLogprob;
use crate::api::tools::prompt::special_ids;
use crate::api::valid_request::ValidRequest;
use crate::serve::lifecycle::InFlightGuard;
use crate::serve::metrics::ServerMetrics;
use crate::serve::state::{random_id, unix_now, AppState};

/// What a choice produced since the last event.
#[derive(Debug)]
pub enum ChoiceEvent {
    /// The prompt's tokens after the first, scored (a request that echoes them): before
    /// the choice's first text.
    PromptScored {
        index: usize,
        logprobs: Vec<TokenLogprobs>,
    },
    Delta {
        index: usize,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        index: usize,
        reason: &'static str,
        completion_tokens: usize,
        /// The stop string that ended the choice, when one did.
        stop_sequence: Option<String>,
        /// The prompt's tokens the prefix cache held.
        cached_prompt_tokens: usize,
    },
    Failed(ServerError),
}

/// One submitted sequence and its detokenizing state.
#[derive(Debug)]
pub struct ChoiceRun {
    pub index: usize,
    pub prompt_index: usize,
    /// `None` once the sequence ended (or was cancelled by a stop string).
    receiver: Option<TokenReceiver>,
    tokenizer: Arc<Tokenizer>,
    decoder: IncrementalDecoder,
    matcher: StopMatcher,
    /// How the text ends: the tokens that end it, whether they are part of it, and how
    /// many tokens come before any stop applies.
    stops: TextStops,
    completion_tokens: usize,
    pending_logprobs: Vec<TokenLogprob>,
    queued: VecDeque<ChoiceEvent>,
    timing: SeqTiming,
    /// The request's stop strings (to name the one that ended the choice) and which did.
    stop_strings: Arc<[String]>,
    stopped_by: Option<usize>,
    /// The prompt's tokens the prefix cache held (known from the first event on).
    cached_prompt_tokens: usize,
    /// The field that asked for the request's constraint (named when the engine refuses
    /// the sequence because of it).
    constraint_param: &'static str,
}

/// The request's stop rules as the text sees them.
#[derive(Debug, Clone)]
struct TextStops {
    /// Tokens that end the choice; their text is dropped unless `include`.
    tokens: Vec<u32>,
    include: bool,
    min_tokens: usize,
}

/// Latency bookkeeping for one sequence; also keeps it counted as in flight.
#[derive(Debug)]
struct SeqTiming {
    metrics: Arc<ServerMetrics>,
    submitted: Instant,
    last_token: Option<Instant>,
    _in_flight: InFlightGuard,
}

impl SeqTiming {
    fn token(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => self
                .metrics
                .time_to_first_token
                .record(now - self.submitted),
            Some(last) => self.metrics.inter_token_latency.record(now - last),
        }
        self.last_token = Some(now);
    }

    fn finished(&self) {
        self.metrics
            .e2e_request_latency
            .record(self.submitted.elapsed());
    }
}

/// A validated request with every choice submitted, and what each response object
/// names: the id, the creation time and the model.
pub struct Submitted {
    pub runs: Vec<ChoiceRun>,
    pub prompt_tokens: usize,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub with_logprobs: bool,
}

impl Submitted {
    /// Submits every choice of `req`; the response id is `{id_prefix}-{random}`.
    pub fn new(app: &AppState, req: &ValidRequest, id_prefix: &str) -> Result<Self, ServerError> {
        app.require_generate()?;
        Ok(Self {
            runs: submit_all(app, req)?,
            prompt_tokens: req.prompts().iter().map(|p| p.ids.len()).sum(),
            id: format!("{id_prefix}-{}", random_id()),
            created: unix_now(),
            model: req.model().to_string(),
            with_logprobs: req.logprobs().is_some(),
        })
    }
}

/// Logs the `user` field of a request: informational only, as in OpenAI's API, it names
/// the end user in logs.
pub fn log_end_user(user: Option<&String>) {
    if let Some(user) = user {
        tracing::debug!(user = %user, "request from end user");
    }
}

/// Logs the fields of a request that nothing reads: a parameter of another server or a
/// typo, which would otherwise change nothing without a word (as vLLM warns).
pub fn log_ignored_fields(ignored: &[String]) {
    if !ignored.is_empty() {
        tracing::warn!(fields = ?ignored, "request fields this server does not know were ignored");
    }
}

/// Submit every choice of `req`. On a refusal the runs already submitted are dropped,
/// which cancels them.
fn submit_all(app: &AppState, req: &ValidRequest) -> Result<Vec<ChoiceRun>, ServerError> {
    // After an engine failure the loop refuses everything as shutting down; say why.
    let health = app.scheduler.health();
    if health.executor_failed || health.panicked {
        return Err(ServerError::EngineDown);
    }
    let tokenizer = &app.validation.tokenizer;
    let mut markers = req
        .tool_output()
        .map(|t| t.marker_ids(tokenizer))
        .unwrap_or_default();
    // The reply's split reads its markers in the text: harmony's channels, or a
    // thinking block's tags where the vocabulary makes them special tokens.
    match req.reasoning() {
        Some(ReplySplit::Harmony) => markers.extend(special_ids(tokenizer, &KEPT_MARKERS)),
        Some(ReplySplit::Think { .. }) => markers.extend(special_ids(tokenizer, &THINK_MARKERS)),
        None => {}
    }
    let stops = TextStops {
        // A tool-call marker stays in the text, where the tool parser reads it.
        tokens: req
            .stopping_tokens()
            .into_iter()
            .filter(|t| !markers.contains(t))
            .collect(),
        include: req.include_stop_str_in_output(),
        min_tokens: req.min_tokens(),
    };
    let stop_strings: Arc<[String]> = req.stop_strings().into();
    let mut runs = Vec::new();
    for planned in req.planned_choices() {
        let (_, receiver) = app.scheduler.submit(planned.request)?;
        let timing = SeqTiming {
            metrics: Arc::clone(&app.metrics),
            submitted: Instant::now(),
            last_token: None,
            _in_flight: app.lifecycle.track_in_flight(),
        };
        runs.push(ChoiceRun {
            index: planned.index,
            prompt_index: planned.prompt_index,
            receiver: Some(receiver),
            tokenizer: Arc::clone(tokenizer),
            decoder: IncrementalDecoder::new(Arc::clone(tokenizer), req.skip_special_tokens())
                .keeping(markers.iter().copied()),
            matcher: StopMatcher::new(req.stop_strings().iter().cloned())
                .including_stop(stops.include),
            stops: stops.clone(),
            completion_tokens: 0,
            pending_logprobs: Vec::new(),
            queued: VecDeque::new(),
            timing,
            constraint_param: req.constraint_param(),
            stop_strings: Arc::clone(&stop_strings),
            stopped_by: None,
            cached_prompt_tokens: 0,
        });
    }
    Ok(runs)
}

impl ChoiceRun {
    /// The next event, or `None` after `Finished` or `Failed`.
    pub async fn next_event(&mut self) -> Option<ChoiceEvent> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            let receiver = self.receiver.as_mut()?;
            let event = receiver.recv().await;
            self.cached_prompt_tokens = receiver.cached_prompt_tokens();
            if let Err(e) = self.apply(event) {
                self.receiver = None;
                self.queued.clear();
                return Some(ChoiceEvent::Failed(e));
            }
        }
    }

    fn apply(&mut self, event: Option<TokenEvent>) -> Result<(), ServerError> {
        match event {
            Some(TokenEvent::Token {
                token,
                logprobs,
                prompt_logprobs,
            }) => {
                if let Some(logprobs) = prompt_logprobs {
                    self.queued.push_back(ChoiceEvent::PromptScored {
                        index: self.index,
                        logprobs,
                    });
                }
                self.timing.token();
                self.completion_tokens += 1;
                if let Some(lp) = logprobs {
                    let entry = self.token_logprob(token, &lp)?;
                    self.pending_logprobs.push(entry);
                }
                // The token that ends the choice is not part of its text (its text,
                // if any, is the stop itself).
                let ends = self.stops.tokens.contains(&token) && !self.stops.include;
                let piece = match ends {
                    true => String::new(),
                    false => self.decoder.push(token)?,
                };
                if self.completion_tokens < self.stops.min_tokens {
                    let text = self.matcher.push_unchecked(&piece);
                    self.queue_delta(text);
                    return Ok(());
                }
                let out = self.matcher.push(&piece);
                self.queue_delta(out.text);
                self.stopped_by = self.stopped_by.or(out.stopped_by);
                if out.stopped_by.is_some() {
                    // Dropping the receiver cancels the sequence in the scheduler.
                    self.timing.finished();
                    self.receiver = None;
                    self.queue_finish("stop");
                }
                Ok(())
            }
            Some(TokenEvent::Finished { reason, .. }) => {
                self.timing.finished();
                self.receiver = None;
                let tail = self.decoder.finish()?;
                let out = self.matcher.push(&tail);
                self.stopped_by = self.stopped_by.or(out.stopped_by);
                let mut text = out.text;
                if out.stopped_by.is_none() {
                    text.push_str(&self.matcher.finish());
                }
                self.queue_delta(text);
                match reason {
                    FinishReason::Stop => self.queue_finish("stop"),
                    FinishReason::Length if out.stopped_by.is_some() => self.queue_finish("stop"),
                    FinishReason::Length => self.queue_finish("length"),
                    FinishReason::Abort => {
                        return Err(ServerError::Admission(AdmissionError::ShuttingDown))
                    }
                }
                Ok(())
            }
            Some(TokenEvent::Error(message)) => Err(ServerError::EngineFailed(message)),
            Some(TokenEvent::Failed(message)) => Err(ServerError::GenerationFailed(message)),
            // A generation is never an embedding sequence.
            Some(TokenEvent::Embedding(_)) => Err(ServerError::Internal(
                "an embedding came back for a generation".into(),
            )),
            // Only a constraint makes the engine refuse a request's sequence.
            Some(TokenEvent::Refused(message)) => {
                Err(ServerError::invalid(self.constraint_param, message))
            }
            // Closed without `Finished`: a submit that raced shutdown.
            None => Err(ServerError::Admission(AdmissionError::ShuttingDown)),
        }
    }

    fn queue_delta(&mut self, text: String) {
        // Log-probabilities travel with the text they belong to; text held back by the
        // stop matcher carries them later.
        if text.is_empty() && self.receiver.is_some() {
            return;
        }
        if text.is_empty() && self.pending_logprobs.is_empty() {
            return;
        }
        self.queued.push_back(ChoiceEvent::Delta {
            index: self.index,
            text,
            logprobs: std::mem::take(&mut self.pending_logprobs),
        });
    }

    fn queue_finish(&mut self, reason: &'static str) {
        if !self.pending_logprobs.is_empty() {
            self.queue_delta(String::new());
        }
        self.queued.push_back(ChoiceEvent::Finished {
            index: self.index,
            reason,
            completion_tokens: self.completion_tokens,
            stop_sequence: self
                .stopped_by
                .and_then(|i| self.stop_strings.get(i).cloned()),
            cached_prompt_tokens: self.cached_prompt_tokens,
        });
    }

    fn token_logprob(&self, token: u32, lp: &TokenLogprobs) -> Result<TokenLogprob, ServerError> {
        token_logprob(&self.tokenizer, token, lp)
    }
}

/// `token` and its alternatives as text, with their log-probabilities.
pub fn token_logprob(
    tokenizer: &Tokenizer,
    token: u32,
    lp: &TokenLogprobs,
) -> Result<TokenLogprob, ServerError> {
    let text = |id: u32| tokenizer.decode(&[id], false);
    Ok(TokenLogprob {
        token: text(token)?,
        logprob: lp.logprob,
        top: lp
            .top
            .iter()
            .map(|&(id, logprob)| Ok((text(id)?, logprob)))
            .collect::<Result<_, tessera_tokenizer::TokenizerError>>()?,
    })
}

/// A whole choice, for non-streaming responses.
#[derive(Debug)]
pub struct ChoiceOutput {
    pub index: usize,
    pub prompt_index: usize,
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// The prompt's tokens after the first, scored, when the request echoes them.
    pub prompt_logprobs: Option<Vec<TokenLogprobs>>,
    pub finish_reason: &'static str,
    pub completion_tokens: usize,
    /// The stop string that ended the choice, when one did.
    pub stop_sequence: Option<String>,
    /// The prompt's tokens the prefix cache held.
    pub cached_prompt_tokens: usize,
}

/// The prompts' tokens the prefix cache held: for each prompt, the most any of its
/// choices found.
pub fn cached_prompt_tokens(outputs: &[ChoiceOutput]) -> usize {
    let mut by_prompt = std::collections::HashMap::new();
    for o in outputs {
        let c = by_prompt.entry(o.prompt_index).or_insert(0);
        *c = (*c).max(o.cached_prompt_tokens);
    }
    by_prompt.values().sum()
}

/// Run every choice to its end, concurrently. The first failure drops the others
/// (cancelling them) and is returned.
pub async fn collect_all(runs: Vec<ChoiceRun>) -> Result<Vec<ChoiceOutput>, ServerError> {
    let mut outputs = try_join_all(runs.into_iter().map(collect_one)).await?;
    outputs.sort_by_key(|o| o.index);
    Ok(outputs)
}

async fn collect_one(mut run: ChoiceRun) -> Result<ChoiceOutput, ServerError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut prompt_logprobs = None;
    while let Some(event) = run.next_event().await {
        match event {
            ChoiceEvent::PromptScored { logprobs: l, .. } => prompt_logprobs = Some(l),
            ChoiceEvent::Delta {
                text: t,
                logprobs: l,
                ..
            } => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            ChoiceEvent::Finished {
                reason,
                completion_tokens,
                stop_sequence,
                cached_prompt_tokens,
                ..
            } => {
                return Ok(ChoiceOutput {
                    index: run.index,
                    prompt_index: run.prompt_index,
                    text,
                    logprobs,
                    prompt_logprobs,
                    finish_reason: reason,
                    completion_tokens,
                    stop_sequence,
                    cached_prompt_tokens,
                })
            }
            ChoiceEvent::Failed(e) => return Err(e),
        }
    }
    Err(ServerError::Internal(
        "a choice ended without finishing".into(),
    ))
}
