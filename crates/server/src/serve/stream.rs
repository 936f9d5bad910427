//! Server-sent events for streamed completions: opening chunks, deltas merged from
//! every choice as they come, a finish chunk per choice, the optional usage chunk, then
//! `data: [DONE]`. A failure mid-stream sends the error envelope, then `[DONE]`.
//!
//! A task of its own turns the choices' events into SSE events and puts them in a
//! bounded channel (`--stream-buffer-events`) the response body reads from. It owns the
//! choices' receivers, so its end cancels the sequences. It ends when:
//! - the client goes away (the body, and so the channel's receiver, is dropped);
//! - the client reads nothing while the channel stays full for
//!   `--stream-stall-timeout`: the stream is cut without `[DONE]`. A client that does
//!   not read can hold at most the channel, the socket buffers and its sequences'
//!   bounded event channels: once those are full the scheduler gives the sequence no
//!   more steps until it reads. It never slows the engine or other requests: the
//!   scheduler's sends never wait;
//! - the request's deadline (`--request-timeout`) passes: a `request_timeout` error
//!   event and `[DONE]` end the stream.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, SelectAll};
use futures_util::StreamExt;
use serde::Serialize;
use tessera_protocol::TokenLogprobs;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::SendTimeoutError;
use tracing::Instrument;

use crate::api::error::ServerError;
use crate::api::response::{TokenLogprob, Usage};
use crate::serve::generation::{ChoiceEvent, ChoiceRun};
use crate::serve::limits::ServerLimits;
use crate::serve::middleware::request_context::{current_request, within};

/// How one route shapes its chunks.
pub trait ChunkFormat: Send + 'static {
    /// The last event of a stream: `[DONE]` for the chat and completions APIs; none for
    /// the Responses API, whose streams end with their `response.*` event.
    fn terminator(&self) -> Option<&'static str> {
        Some("[DONE]")
    }
    /// Chunks before any generated text, given `(index, prompt_index)` of every choice.
    fn opening(&mut self, choices: &[(usize, usize)]) -> Vec<String>;
    /// Chunks for the scored prompt of choice `index` (a request that echoes the prompt
    /// with its log-probabilities), before any of its text.
    fn prompt_scored(
        &mut self,
        _index: usize,
        _logprobs: &[TokenLogprobs],
    ) -> Result<Vec<String>, ServerError> {
        Ok(Vec::new())
    }
    /// Chunks for new text of choice `index` (none while a format holds text back).
    fn delta(&mut self, index: usize, text: String, logprobs: &[TokenLogprob]) -> Vec<String>;
    /// Chunks that end choice `index`: whatever was held back, then how it ended.
    fn finish(&mut self, index: usize, end: &ChoiceEnd) -> Vec<String>;
    fn usage(&mut self, usage: Usage) -> String;

    /// Whether each event carries its chunk's `type` as its SSE `event:` name, as the
    /// Responses and Messages APIs' streams do.
    fn named_events() -> bool
    where
        Self: Sized,
    {
        false
    }

    /// The data of the event that ends a stream with `e`.
    fn error_data(e: &ServerError) -> String
    where
        Self: Sized,
    {
        to_json(&e.body())
    }

    /// What keeps an idle stream open: a comment line unless the API names an event.
    fn keep_alive() -> KeepAlive
    where
        Self: Sized,
    {
        KeepAlive::default()
    }
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChoiceEnd {
    /// `stop` or `length`.
    pub reason: &'static str,
    /// The stop string that ended it, when one did.
    pub stop_sequence: Option<String>,
}

/// JSON text of a chunk. Serializing these plain structs cannot fail; if it ever did,
/// an empty object keeps the stream well-formed.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "{}".to_string())
}

/// One SSE event carrying `data` (a JSON chunk or `[DONE]`).
pub fn frame(data: impl AsRef<str>) -> Event {
    Event::default().data(data)
}

/// One SSE event of format `F`: named after its chunk's `type` where `F` names events.
fn framed<F: ChunkFormat>(data: String) -> Event {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<&'a str>,
    }
    let name = match F::named_events() {
        true => serde_json::from_str::<Typed<'_>>(&data)
            .ok()
            .and_then(|t| t.kind.map(str::to_string)),
        false => None,
    };
    match name {
        Some(name) => Event::default().event(name).data(data),
        None => Event::default().data(data),
    }
}

struct StreamState<F> {
    merged: SelectAll<BoxStream<'static, ChoiceEvent>>,
    queued: VecDeque<Event>,
    format: F,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Each prompt's tokens the prefix cache held (the most any of its choices found).
    cached: std::collections::HashMap<usize, usize>,
    prompt_of: std::collections::HashMap<usize, usize>,
    include_usage: bool,
    done: bool,
}

impl<F: ChunkFormat> StreamState<F> {
    /// Ends the stream with `e`'s error event; dropping the other choices cancels them.
    fn fail(&mut self, e: ServerError, terminator: Option<&'static str>) {
        e.log();
        self.merged = SelectAll::new();
        self.queued.push_back(framed::<F>(F::error_data(&e)));
        self.queued
            .extend(terminator.map(|t| framed::<F>(t.to_string())));
        self.done = true;
    }
}

/// The SSE response for `runs`. `prompt_tokens` counts each prompt once.
pub fn sse_response<F: ChunkFormat>(
    runs: Vec<ChoiceRun>,
    mut format: F,
    prompt_tokens: usize,
    include_usage: bool,
    limits: &ServerLimits,
) -> Response {
    let choices: Vec<(usize, usize)> = runs.iter().map(|r| (r.index, r.prompt_index)).collect();
    let queued = format
        .opening(&choices)
        .into_iter()
        .map(framed::<F>)
        .collect();
    let terminator = format.terminator();
    let merged = stream::select_all(runs.into_iter().map(|run| {
        stream::unfold(run, |mut run| async move {
            run.next_event().await.map(|event| (event, run))
        })
        .boxed()
    }));
    let state = StreamState {
        merged,
        queued,
        format,
        prompt_tokens,
        completion_tokens: 0,
        cached: Default::default(),
        prompt_of: choices.iter().copied().collect(),
        include_usage,
        done: false,
    };
    let events = stream::unfold(state, move |mut s| async move {
        loop {
            if let Some(event) = s.queued.pop_front() {
                return Some((event, s));
            }
            if s.done {
                return None;
            }
            match s.merged.next().await {
                Some(ChoiceEvent::PromptScored { index, logprobs }) => {
                    match s.format.prompt_scored(index, &logprobs) {
                        Ok(chunks) => s.queued.extend(chunks.into_iter().map(framed::<F>)),
                        Err(e) => s.fail(e, terminator),
                    }
                }
                Some(ChoiceEvent::Delta {
                    index,
                    text,
                    logprobs,
                }) => {
                    let chunks = s.format.delta(index, text, &logprobs);
                    s.queued.extend(chunks.into_iter().map(framed::<F>));
                }
                Some(ChoiceEvent::Finished {
                    index,
                    reason,
                    completion_tokens,
                    stop_sequence,
                    cached_prompt_tokens,
                }) => {
                    s.completion_tokens += completion_tokens;
                    let prompt = s.prompt_of.get(&index).copied().unwrap_or(0);
                    let cached = s.cached.entry(prompt).or_default();
                    *cached = (*cached).max(cached_prompt_tokens);
                    let end = ChoiceEnd {
                        reason,
                        stop_sequence,
                    };
                    let chunks = s.format.finish(index, &end);
                    s.queued.extend(chunks.into_iter().map(framed::<F>));
                }
                Some(ChoiceEvent::Failed(e)) => s.fail(e, terminator),
                None => {
                    if s.include_usage {
                        let usage = Usage::new(s.prompt_tokens, s.completion_tokens)
                            .with_cached(s.cached.values().sum());
                        let data = s.format.usage(usage);
                        s.queued.push_back(framed::<F>(data));
                    }
                    s.queued
                        .extend(terminator.map(|t| framed::<F>(t.to_string())));
                    s.done = true;
                }
            }
        }
    });
    let (sender, mut receiver) = mpsc::channel(limits.stream_buffer_events.max(1));
    let scope = current_request();
    let ends = StreamEnds {
        deadline: scope.as_ref().and_then(|s| s.deadline),
        timeout: limits.request_timeout.unwrap_or_default(),
        stall: limits.stream_stall_timeout,
        terminator: terminator.map(|t| framed::<F>(t.to_string())),
        error_event: |e| framed::<F>(F::error_data(e)),
    };
    // Log lines written while streaming carry the request's span (its request id).
    let span = tracing::Span::current();
    tokio::spawn(within(scope, pump(events.boxed(), sender, ends)).instrument(span));
    let body =
        stream::poll_fn(move |cx| receiver.poll_recv(cx).map(|e| e.map(Ok::<_, Infallible>)));
    Sse::new(body).keep_alive(F::keep_alive()).into_response()
}

/// When a stream is cut short.
struct StreamEnds {
    deadline: Option<Instant>,
    /// The request timeout the deadline comes from (for the error message).
    timeout: Duration,
    /// How long the channel may stay full.
    stall: Duration,
    /// The format's last event, if it has one.
    terminator: Option<Event>,
    /// The event that ends the stream with an error, in the format's shape.
    error_event: fn(&ServerError) -> Event,
}

/// Move `events` into `sender` until the stream ends, the client leaves or stalls, or
/// the deadline passes. Returning drops `events` and so cancels the sequences.
async fn pump(
    mut events: BoxStream<'static, Event>,
    sender: mpsc::Sender<Event>,
    ends: StreamEnds,
) {
    loop {
        let next_event = async {
            match ends.deadline {
                Some(deadline) => tokio::time::timeout_at(deadline.into(), events.next()).await,
                None => Ok(events.next().await),
            }
        };
        let next = tokio::select! {
            // The body was dropped (the client closed the connection) while the next
            // event is not ready yet: queued or prefilling, the sequences are cancelled
            // now, not at the first write.
            () = sender.closed() => return,
            next = next_event => next,
        };
        let event = match next {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(_) => {
                drop(events);
                let e = ServerError::RequestTimeout {
                    limit_secs: ends.timeout.as_secs(),
                };
                e.log();
                // A full buffer means a client that does not read: it gets nothing more.
                let _ = sender.try_send((ends.error_event)(&e));
                if let Some(last) = ends.terminator {
                    let _ = sender.try_send(last);
                }
                return;
            }
        };
        match sender.send_timeout(event, ends.stall).await {
            Ok(()) => {}
            Err(SendTimeoutError::Timeout(_)) => {
                tracing::warn!(
                    "the client read nothing for {}s while the stream buffer was full: cancelling the request",
                    ends.stall.as_secs_f64()
                );
                return;
            }
            Err(SendTimeoutError::Closed(_)) => return,
        }
    }
}
