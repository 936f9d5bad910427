//! `POST /v1/messages` (Anthropic's Messages API) and `POST /v1/messages/count_tokens`.
//! A message runs as the chat request it stands for; the reply is a message object, or
//! streamed as Anthropic's events: `message_start`, `ping`, then per content block
//! `content_block_start`, its `content_block_delta`s (`thinking_delta`, `text_delta`,
//! `input_json_delta`) and `content_block_stop`, then `message_delta` (the stop reason
//! and usage) and `message_stop`. An error mid-stream is an `error` event. Errors of
//! these routes leave in Anthropic's envelope (see the request context layer).

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::api::chat::request::ChatRequest;
use crate::api::error::ServerError;
use crate::api::messages::error::anthropic_error;
use crate::api::messages::reply::{
    stop_reason, text_block, thinking_block, tool_input, tool_use_block, usage, MessageHeader,
};
use crate::api::messages::request::{messages_request, MessagesRequest, Thinking};
use crate::api::reasoning::{ReasoningSplit, ReplySplit, Split};
use crate::api::response::{TokenLogprob, Usage};
use crate::api::tools::parsers::{ParsedReply, ToolCallParser, ToolEvent};
use crate::api::valid_request::ValidRequest;
use crate::serve::generation::{
    cached_prompt_tokens, collect_all, log_end_user, log_ignored_fields, Submitted,
};
use crate::serve::json_body::JsonBody;
use crate::serve::state::{random_id, AppState};
use crate::serve::stream::{sse_response, to_json, ChoiceEnd, ChunkFormat};

/// A `tool_use` block's id.
fn tool_use_id() -> String {
    format!("toolu_{}", random_id())
}

/// The validated chat request a Messages request stands for.
async fn validate(app: &AppState, req: &MessagesRequest) -> Result<ValidRequest, ServerError> {
    let mut chat = req.chat.clone();
    let template = app
        .validation
        .tokenizer
        .chat_template()
        .map(|t| t.source().to_string())
        .unwrap_or_default();
    // Templates that can be told (Qwen3's) are told whether to think.
    let told = template.contains("enable_thinking");
    match req.thinking {
        Thinking::Enabled { .. } if told => {
            chat["chat_template_kwargs"] = json!({"enable_thinking": true});
        }
        Thinking::Disabled if told => {
            chat["chat_template_kwargs"] = json!({"enable_thinking": false});
        }
        _ => {}
    }
    let chat_req = ChatRequest::parse(&chat)?;
    log_end_user(chat_req.params.user.as_ref());
    let mut valid = ValidRequest::chat(chat_req, &app.validation).await?;
    match req.thinking {
        Thinking::Enabled { budget_tokens } => {
            if valid.reasoning().is_none() {
                return Err(ServerError::invalid(
                    "thinking",
                    "this model does not think: its chat template writes no thinking block",
                ));
            }
            valid.limit_thinking(budget_tokens, &app.validation)?;
        }
        // A template that cannot be told not to think gets no room for it.
        Thinking::Disabled if !told && valid.reasoning().is_some() => {
            valid.limit_thinking(0, &app.validation)?;
        }
        _ => {}
    }
    Ok(valid)
}

pub async fn create_message(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let req = messages_request(&body)?;
    log_ignored_fields(&req.ignored);
    let valid = validate(&app, &req).await?;
    let Submitted {
        runs,
        prompt_tokens,
        id,
        model,
        ..
    } = Submitted::new(&app, &valid, "msg")?;
    let header = MessageHeader {
        id: id.replacen("msg-", "msg_", 1),
        model,
    };
    let parser = || valid.tool_output().map(|t| t.parser());
    if req.stream {
        let format = MessagesFormat::new(header, prompt_tokens, parser(), valid.reasoning());
        return Ok(sse_response(runs, format, prompt_tokens, true, &app.limits));
    }
    let outputs = collect_all(runs).await?;
    let cached = cached_prompt_tokens(&outputs);
    let Some(out) = outputs.into_iter().next() else {
        return Err(ServerError::Internal("a message without output".into()));
    };
    let (thinking, text) = match valid.reasoning() {
        Some(how) => {
            let split = ReasoningSplit::whole(how, &out.text);
            (split.reasoning, split.content)
        }
        None => (String::new(), out.text),
    };
    let mut content = Vec::new();
    if !thinking.is_empty() {
        content.push(thinking_block(&thinking));
    }
    let reply = match parser() {
        Some(p) => ParsedReply::parse(p, &text),
        None => ParsedReply {
            content: Some(text),
            calls: Vec::new(),
        },
    };
    if let Some(text) = reply.content.filter(|t| !t.is_empty()) {
        content.push(text_block(&text));
    }
    let mut made_calls = false;
    for (name, arguments) in &reply.calls {
        match tool_input(arguments) {
            Some(input) => {
                content.push(tool_use_block(&tool_use_id(), name, input));
                made_calls = true;
            }
            // Arguments that are no JSON object cannot be a tool use: they stay text.
            None => content.push(text_block(arguments)),
        }
    }
    let stop = out.stop_sequence.as_deref();
    let reason = stop_reason(out.finish_reason, stop, made_calls);
    let stop = stop.filter(|_| reason == "stop_sequence");
    let usage = usage(prompt_tokens, out.completion_tokens, cached);
    Ok(Json(header.object(content, Some(reason), stop, usage)).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, as `/v1/messages` would make
/// the prompt (`max_tokens` is not needed).
pub async fn count_tokens(
    State(app): State<AppState>,
    JsonBody(mut body): JsonBody,
) -> Result<Response, ServerError> {
    if let Value::Object(b) = &mut body {
        b.entry("max_tokens").or_insert(json!(1));
        b.remove("stream");
    }
    let req = messages_request(&body)?;
    let valid = validate(&app, &req).await?;
    let tokens: usize = valid.prompts().iter().map(|p| p.ids.len()).sum();
    Ok(Json(json!({"input_tokens": tokens})).into_response())
}

/// The block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    ToolUse,
}

/// Anthropic's event sequence of one streamed message.
pub struct MessagesFormat {
    header: MessageHeader,
    prompt_tokens: usize,
    parser: Option<Box<dyn ToolCallParser>>,
    split: Option<ReasoningSplit>,
    /// Blocks started so far; the open one is the last.
    blocks: usize,
    open: Option<Open>,
    made_calls: bool,
    end: Option<ChoiceEnd>,
}

impl MessagesFormat {
    fn new(
        header: MessageHeader,
        prompt_tokens: usize,
        parser: Option<Box<dyn ToolCallParser>>,
        reasoning: Option<ReplySplit>,
    ) -> Self {
        MessagesFormat {
            header,
            prompt_tokens,
            parser,
            split: reasoning.map(ReasoningSplit::new),
            blocks: 0,
            open: None,
            made_calls: false,
            end: None,
        }
    }

    /// Starts a block of kind `open` with `block` as its first form, closing the one
    /// open unless it is of that kind already.
    fn ensure(&mut self, open: Open, block: impl FnOnce() -> Value, out: &mut Vec<String>) {
        if self.open == Some(open) && open != Open::ToolUse {
            return;
        }
        self.close(out);
        out.push(to_json(&json!({
            "type": "content_block_start",
            "index": self.blocks,
            "content_block": block(),
        })));
        self.blocks += 1;
        self.open = Some(open);
    }

    fn close(&mut self, out: &mut Vec<String>) {
        if self.open.take().is_some() {
            out.push(to_json(&json!({
                "type": "content_block_stop",
                "index": self.blocks - 1,
            })));
        }
    }

    fn block_delta(&self, delta: Value) -> String {
        to_json(&json!({
            "type": "content_block_delta",
            "index": self.blocks.saturating_sub(1),
            "delta": delta,
        }))
    }

    fn thinking(&mut self, text: &str, out: &mut Vec<String>) {
        if text.is_empty() {
            return;
        }
        self.ensure(Open::Thinking, || thinking_block(""), out);
        out.push(self.block_delta(json!({"type": "thinking_delta", "thinking": text})));
    }

    fn text(&mut self, text: &str, out: &mut Vec<String>) {
        if text.is_empty() {
            return;
        }
        self.ensure(Open::Text, || text_block(""), out);
        out.push(self.block_delta(json!({"type": "text_delta", "text": text})));
    }

    /// Answer text: through the tool-call parser when calls may be in it.
    fn answer(&mut self, text: String, out: &mut Vec<String>) {
        match &mut self.parser {
            Some(p) => {
                let events = p.push(&text);
                self.apply(events, out);
            }
            None => self.text(&text, out),
        }
    }

    fn split(&mut self, split: Split, out: &mut Vec<String>) {
        self.thinking(&split.reasoning, out);
        self.answer(split.content, out);
    }

    fn apply(&mut self, events: Vec<ToolEvent>, out: &mut Vec<String>) {
        for event in events {
            match event {
                ToolEvent::Content(text) => self.text(&text, out),
                ToolEvent::CallStart { name, .. } => {
                    let id = tool_use_id();
                    self.ensure(Open::ToolUse, || tool_use_block(&id, &name, json!({})), out);
                    self.made_calls = true;
                }
                ToolEvent::CallArguments { fragment, .. } => {
                    if self.open == Some(Open::ToolUse) {
                        out.push(self.block_delta(
                            json!({"type": "input_json_delta", "partial_json": fragment}),
                        ));
                    }
                }
            }
        }
    }
}

impl ChunkFormat for MessagesFormat {
    fn terminator(&self) -> Option<&'static str> {
        Some(r#"{"type":"message_stop"}"#)
    }

    fn opening(&mut self, _choices: &[(usize, usize)]) -> Vec<String> {
        let start = self
            .header
            .object(Vec::new(), None, None, usage(self.prompt_tokens, 0, 0));
        vec![
            to_json(&json!({"type": "message_start", "message": start})),
            to_json(&json!({"type": "ping"})),
        ]
    }

    fn delta(&mut self, _index: usize, text: String, _logprobs: &[TokenLogprob]) -> Vec<String> {
        let mut out = Vec::new();
        match self.split.as_mut().map(|s| s.push(&text)) {
            Some(split) => self.split(split, &mut out),
            None => self.answer(text, &mut out),
        }
        out
    }

    fn finish(&mut self, _index: usize, end: &ChoiceEnd) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(rest) = self.split.as_mut().map(ReasoningSplit::finish) {
            self.split(rest, &mut out);
        }
        if let Some(p) = &mut self.parser {
            let events = p.finish();
            self.apply(events, &mut out);
        }
        self.close(&mut out);
        self.end = Some(end.clone());
        out
    }

    fn usage(&mut self, u: Usage) -> String {
        let end = self.end.take().unwrap_or(ChoiceEnd {
            reason: "stop",
            stop_sequence: None,
        });
        let stop = end.stop_sequence.as_deref();
        let reason = stop_reason(end.reason, stop, self.made_calls);
        let stop = stop.filter(|_| reason == "stop_sequence");
        to_json(&json!({
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop},
            "usage": usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens()),
        }))
    }

    fn named_events() -> bool {
        true
    }

    fn error_data(e: &ServerError) -> String {
        let message = e.body().error.message;
        to_json(&anthropic_error(e.status().as_u16(), &message).1)
    }

    /// Anthropic's streams ping while they wait.
    fn keep_alive() -> KeepAlive {
        KeepAlive::new().event(Event::default().event("ping").data(r#"{"type":"ping"}"#))
    }
}
