//! Server-sent events for streamed completions: opening chunks, deltas merged from
//! every choice as they come, a finish chunk per choice, the optional usage chunk, then
//! `data: [DONE]`. A failure mid-stream sends the error envelope, then `[DONE]`.
//!
//! The stream owns the choices' receivers: when the client goes away the body stream
//! is dropped, and with it every receiver, which cancels the sequences.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, SelectAll};
use futures_util::StreamExt;
use serde::Serialize;
use tracing::Instrument;

use crate::api::response::{TokenLogprob, Usage};
use crate::serve::generation::{ChoiceEvent, ChoiceRun};

/// How one route shapes its chunks.
pub trait ChunkFormat: Send + 'static {
    /// Chunks before any generated text, given `(index, prompt_index)` of every choice.
    fn opening(&mut self, choices: &[(usize, usize)]) -> Vec<String>;
    fn delta(&mut self, index: usize, text: String, logprobs: &[TokenLogprob]) -> String;
    fn finish(&mut self, index: usize, reason: &'static str) -> String;
    fn usage(&mut self, usage: Usage) -> String;
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

struct StreamState<F> {
    merged: SelectAll<BoxStream<'static, ChoiceEvent>>,
    queued: VecDeque<Event>,
    format: F,
    prompt_tokens: usize,
    completion_tokens: usize,
    include_usage: bool,
    done: bool,
}

/// The SSE response for `runs`. `prompt_tokens` counts each prompt once.
pub fn sse_response<F: ChunkFormat>(
    runs: Vec<ChoiceRun>,
    mut format: F,
    prompt_tokens: usize,
    include_usage: bool,
) -> Response {
    let choices: Vec<(usize, usize)> = runs.iter().map(|r| (r.index, r.prompt_index)).collect();
    let queued = format.opening(&choices).into_iter().map(frame).collect();
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
        include_usage,
        done: false,
    };
    // Log lines written while streaming carry the request's span (its request id).
    let span = tracing::Span::current();
    let events = stream::unfold(state, move |mut s| {
        let span = span.clone();
        async move {
            loop {
                if let Some(event) = s.queued.pop_front() {
                    return Some((Ok::<Event, Infallible>(event), s));
                }
                if s.done {
                    return None;
                }
                match s.merged.next().await {
                    Some(ChoiceEvent::Delta {
                        index,
                        text,
                        logprobs,
                    }) => {
                        let data = s.format.delta(index, text, &logprobs);
                        s.queued.push_back(frame(data));
                    }
                    Some(ChoiceEvent::Finished {
                        index,
                        reason,
                        completion_tokens,
                    }) => {
                        s.completion_tokens += completion_tokens;
                        let data = s.format.finish(index, reason);
                        s.queued.push_back(frame(data));
                    }
                    Some(ChoiceEvent::Failed(e)) => {
                        e.log();
                        // Dropping the other choices cancels them.
                        s.merged = SelectAll::new();
                        s.queued.push_back(frame(to_json(&e.body())));
                        s.queued.push_back(frame("[DONE]"));
                        s.done = true;
                    }
                    None => {
                        if s.include_usage {
                            let usage = Usage::new(s.prompt_tokens, s.completion_tokens);
                            let data = s.format.usage(usage);
                            s.queued.push_back(frame(data));
                        }
                        s.queued.push_back(frame("[DONE]"));
                        s.done = true;
                    }
                }
            }
        }
        .instrument(span)
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
