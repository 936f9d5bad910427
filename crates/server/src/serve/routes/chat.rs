//! `POST /v1/chat/completions`.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::chat::request::ChatRequest;
use crate::api::error::ServerError;
use crate::api::reasoning::{ReasoningSplit, ReplySplit, Split};
use crate::api::response::{
    ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatDelta, ChatLogprobs, Reasoning,
    TokenLogprob, Usage,
};
use crate::api::tools::prompt::ToolOutput;
use crate::api::valid_request::ValidRequest;
use crate::serve::generation::{
    cached_prompt_tokens, collect_all, log_end_user, log_ignored_fields, Submitted,
};
use crate::serve::json_body::JsonBody;
use crate::serve::routes::chat_tools::{finish_reason, reply_message, StreamedCalls};
use crate::serve::state::AppState;
use crate::serve::stream::{sse_response, to_json, ChoiceEnd, ChunkFormat};

pub async fn chat_completions(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = ChatRequest::parse(&body)?;
    log_end_user(req.params.user.as_ref());
    log_ignored_fields(&req.ignored);
    let valid = ValidRequest::chat(req, &app.validation).await?;
    let Submitted {
        runs,
        prompt_tokens,
        id,
        created,
        model,
        with_logprobs,
    } = Submitted::new(&app, &valid, "chatcmpl")?;
    if valid.stream() {
        let format = ChatFormat::new(id, created, model, with_logprobs)
            .with_tools(valid.tool_output().cloned())
            .with_reasoning(valid.reasoning());
        return Ok(sse_response(
            runs,
            format,
            prompt_tokens,
            valid.include_usage(),
            &app.limits,
        ));
    }
    let outputs = collect_all(runs).await?;
    let cached = cached_prompt_tokens(&outputs);
    let completion_tokens = outputs.iter().map(|o| o.completion_tokens).sum();
    let choices = outputs
        .into_iter()
        .map(|o| {
            let (reasoning, text) = match valid.reasoning() {
                Some(how) => {
                    let split = ReasoningSplit::whole(how, &o.text);
                    (Reasoning::of(split.reasoning), split.content)
                }
                None => (None, o.text),
            };
            let (mut message, made_calls) = reply_message(valid.tool_output(), text);
            message.reasoning = reasoning;
            ChatChoice {
                index: o.index,
                message,
                logprobs: with_logprobs.then(|| ChatLogprobs::from_tokens(&o.logprobs)),
                finish_reason: finish_reason(o.finish_reason, made_calls),
            }
        })
        .collect();
    Ok(Json(ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model,
        choices,
        usage: Usage::new(prompt_tokens, completion_tokens).with_cached(cached),
    })
    .into_response())
}

/// The `chat.completion.chunk` chunks of a streamed chat completion.
pub struct ChatFormat {
    id: String,
    created: u64,
    model: String,
    with_logprobs: bool,
    /// How tool calls are read from each choice's text, when they may be there.
    tools: Option<ToolOutput>,
    calls: HashMap<usize, StreamedCalls>,
    /// How each choice's thinking is split from its answer, where it is.
    reasoning: Option<ReplySplit>,
    splits: HashMap<usize, ReasoningSplit>,
}

impl ChatFormat {
    /// Chunks of one streamed chat completion.
    pub fn new(id: String, created: u64, model: String, with_logprobs: bool) -> Self {
        ChatFormat {
            id,
            created,
            model,
            with_logprobs,
            tools: None,
            calls: HashMap::new(),
            reasoning: None,
            splits: HashMap::new(),
        }
    }

    /// Splits each choice's thinking from its answer, where `reasoning` says how.
    pub fn with_reasoning(mut self, reasoning: Option<ReplySplit>) -> Self {
        self.reasoning = reasoning;
        self
    }

    /// `text` split into thinking and answer, when replies are split.
    fn split(&mut self, index: usize, text: &str, finished: bool) -> Option<Split> {
        let how = self.reasoning?;
        let split = self
            .splits
            .entry(index)
            .or_insert_with(|| ReasoningSplit::new(how));
        Some(match finished {
            true => split.push_last(text),
            false => split.push(text),
        })
    }

    /// The chunk of a thinking delta.
    fn reasoning_chunk(&self, index: usize, text: String, logprobs: &[TokenLogprob]) -> String {
        let delta = ChatDelta {
            reasoning: Reasoning::of(text),
            ..ChatDelta::default()
        };
        self.delta_chunk(index, delta, logprobs)
    }

    /// Reads tool calls from the text with `tools`' parser.
    pub fn with_tools(mut self, tools: Option<ToolOutput>) -> Self {
        self.tools = tools;
        self
    }

    fn delta_chunk(&self, index: usize, delta: ChatDelta, logprobs: &[TokenLogprob]) -> String {
        self.chunk(
            vec![ChatChunkChoice {
                index,
                delta,
                logprobs: (self.with_logprobs && !logprobs.is_empty())
                    .then(|| ChatLogprobs::from_tokens(logprobs)),
                finish_reason: None,
            }],
            None,
        )
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        to_json(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }
}

impl ChunkFormat for ChatFormat {
    fn opening(&mut self, choices: &[(usize, usize)]) -> Vec<String> {
        choices
            .iter()
            .map(|&(index, _)| {
                self.chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta: ChatDelta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            ..ChatDelta::default()
                        },
                        logprobs: None,
                        finish_reason: None,
                    }],
                    None,
                )
            })
            .collect()
    }

    fn delta(&mut self, index: usize, text: String, logprobs: &[TokenLogprob]) -> Vec<String> {
        match self.split(index, &text, false) {
            Some(split) => self.split_chunks(index, split, logprobs),
            None => self.content_chunks(index, text, logprobs),
        }
    }

    fn finish(&mut self, index: usize, end: &ChoiceEnd) -> Vec<String> {
        let reason = end.reason;
        let mut chunks = match self.split(index, "", true) {
            Some(split) => self.split_chunks(index, split, &[]),
            None => Vec::new(),
        };
        chunks.extend(self.finish_content(index, reason));
        chunks
    }

    fn usage(&mut self, usage: Usage) -> String {
        self.chunk(Vec::new(), Some(usage))
    }
}

impl ChatFormat {
    /// The chunks of split text: its thinking, then its answer; the log-probabilities go
    /// with the first chunk, or alone when the text is held at a tag.
    fn split_chunks(
        &mut self,
        index: usize,
        split: Split,
        logprobs: &[TokenLogprob],
    ) -> Vec<String> {
        let mut chunks = Vec::new();
        let mut logprobs = logprobs;
        if !split.reasoning.is_empty() {
            chunks.push(self.reasoning_chunk(index, split.reasoning, logprobs));
            logprobs = &[];
        }
        if !split.content.is_empty() {
            chunks.extend(self.content_chunks(index, split.content, logprobs));
        } else if chunks.is_empty() && self.with_logprobs && !logprobs.is_empty() {
            chunks.push(self.delta_chunk(index, ChatDelta::default(), logprobs));
        }
        chunks
    }

    /// The chunks of answer text: plain, or through the tool-call parser.
    fn content_chunks(
        &mut self,
        index: usize,
        text: String,
        logprobs: &[TokenLogprob],
    ) -> Vec<String> {
        let Some(tools) = &self.tools else {
            let delta = ChatDelta {
                content: Some(text),
                ..ChatDelta::default()
            };
            return vec![self.chunk(
                vec![ChatChunkChoice {
                    index,
                    delta,
                    logprobs: self
                        .with_logprobs
                        .then(|| ChatLogprobs::from_tokens(logprobs)),
                    finish_reason: None,
                }],
                None,
            )];
        };
        let calls = self
            .calls
            .entry(index)
            .or_insert_with(|| StreamedCalls::new(tools));
        let mut deltas = calls.push(&text);
        // Log-probabilities go with the first chunk, or alone when the text is held.
        if deltas.is_empty() && self.with_logprobs && !logprobs.is_empty() {
            deltas.push(ChatDelta::default());
        }
        deltas
            .into_iter()
            .enumerate()
            .map(|(i, d)| self.delta_chunk(index, d, if i == 0 { logprobs } else { &[] }))
            .collect()
    }

    /// The last chunks of a choice's answer: the tool parser's rest, and the finish
    /// reason.
    fn finish_content(&mut self, index: usize, reason: &'static str) -> Vec<String> {
        let (mut chunks, made_calls) = match self.calls.get_mut(&index) {
            Some(calls) => {
                let deltas = calls.finish();
                let made_calls = calls.made_calls();
                let chunks = deltas
                    .into_iter()
                    .map(|d| self.delta_chunk(index, d, &[]))
                    .collect();
                (chunks, made_calls)
            }
            None => (Vec::new(), false),
        };
        chunks.push(self.chunk(
            vec![ChatChunkChoice {
                index,
                delta: ChatDelta::default(),
                logprobs: None,
                finish_reason: Some(finish_reason(reason, made_calls)),
            }],
            None,
        ));
        chunks
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::api::tools::parsers::ToolParserKind;

    /// A Qwen3-style reply: it thinks, then calls a tool in the Hermes form.
    const REPLY: &str = "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n\
        {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    /// The same reply from gpt-oss, in harmony channels.
    const HARMONY_REPLY: &str = "<|channel|>analysis<|message|>The user wants the weather.\
        <|end|><|start|>assistant<|channel|>commentary to=functions.get_weather \
        <|constrain|>json<|message|>{\"city\": \"Paris\"}";

    #[test]
    fn thinking_then_a_call_streams_as_reasoning_then_tool_call_deltas() {
        let cases = [
            (REPLY, ReplySplit::Think { open: false }),
            (HARMONY_REPLY, ReplySplit::Harmony),
        ];
        for ((reply, how), piece) in cases
            .into_iter()
            .flat_map(|c| [1, 3, 7, 500].map(|p| (c, p)))
        {
            let mut format = ChatFormat::new("id".into(), 0, "m".into(), false)
                .with_tools(Some(ToolOutput::Parsed(ToolParserKind::Hermes)))
                .with_reasoning(Some(how));
            let mut chunks = Vec::new();
            let chars: Vec<char> = reply.chars().collect();
            for part in chars.chunks(piece) {
                chunks.extend(format.delta(0, part.iter().collect(), &[]));
            }
            chunks.extend(format.finish(
                0,
                &ChoiceEnd {
                    reason: "stop",
                    stop_sequence: None,
                },
            ));
            let (mut thinking, mut content, mut name, mut args, mut reason) = (
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            );
            for chunk in &chunks {
                let v: Value = serde_json::from_str(chunk).unwrap_or_default();
                let c = &v["choices"][0];
                let d = &c["delta"];
                thinking.push_str(d["reasoning"].as_str().unwrap_or(""));
                assert_eq!(d["reasoning"], d["reasoning_content"]);
                content.push_str(d["content"].as_str().unwrap_or(""));
                for call in d["tool_calls"].as_array().into_iter().flatten() {
                    name.push_str(call["function"]["name"].as_str().unwrap_or(""));
                    args.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
                }
                reason.push_str(c["finish_reason"].as_str().unwrap_or(""));
            }
            assert_eq!(
                thinking, "The user wants the weather.",
                "{how:?} in {piece}s"
            );
            assert_eq!(content.trim(), "", "{how:?} in pieces of {piece}");
            assert_eq!(name, "get_weather");
            let args: Value = serde_json::from_str(&args).unwrap_or_default();
            assert_eq!(args, serde_json::json!({"city": "Paris"}));
            assert_eq!(reason, "tool_calls");
        }
    }
}
