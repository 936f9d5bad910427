//! `POST /v1/responses`, stateless: the request runs as the chat request it stands for;
//! the reply is shaped as a Responses object, or streamed as its event sequence
//! (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`, ...,
//! `response.function_call_arguments.delta`, ..., `response.completed`).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tessera_tokenizer::Tokenizer;

use crate::api::chat::request::ChatRequest;
use crate::api::error::ServerError;
use crate::api::reasoning::{ReasoningSplit, ReplySplit, Split};
use crate::api::response::{TokenLogprob, Usage};
use crate::api::responses::object::{
    function_call_item, logprob_values, message_item, output_text_part, reasoning_item, status_of,
    OutputUsage, ResponseHeader,
};
use crate::api::responses::request::{chat_body, in_responses_terms};
use crate::api::tools::parsers::{ParsedReply, ToolCallParser, ToolEvent};
use crate::api::valid_request::ValidRequest;
use crate::serve::generation::{collect_all, log_end_user, log_ignored_fields, Submitted};
use crate::serve::json_body::JsonBody;
use crate::serve::routes::chat_tools::new_call_id;
use crate::serve::state::{random_id, AppState};
use crate::serve::stream::{sse_response, to_json, ChoiceEnd, ChunkFormat};

pub async fn create_response(
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Response, ServerError> {
    let (chat, ignored) = chat_body(&body)?;
    let req = ChatRequest::parse(&chat).map_err(in_responses_terms)?;
    log_end_user(req.params.user.as_ref());
    log_ignored_fields(&ignored);
    let valid = ValidRequest::chat(req, &app.validation)
        .await
        .map_err(in_responses_terms)?;
    if valid.reasoning().is_some() && valid.logprobs().is_some() {
        return Err(ServerError::invalid(
            "include",
            "log-probabilities are not available when replies are split into reasoning and \
             text (start the server with `--reasoning-parser none`)",
        ));
    }
    let tokenizer = Arc::clone(&app.validation.tokenizer);
    let Submitted {
        runs,
        prompt_tokens,
        id,
        created,
        model,
        ..
    } = Submitted::new(&app, &valid, "resp")?;
    let header = ResponseHeader {
        id: id.replacen("resp-", "resp_", 1),
        created_at: created,
        model,
        request: body,
    };
    let parser = || -> Option<Box<dyn ToolCallParser>> { valid.tool_output().map(|t| t.parser()) };
    if valid.stream() {
        let format = ResponsesFormat::new(header, parser(), valid.reasoning(), tokenizer);
        // The usage chunk carries `response.completed`.
        return Ok(sse_response(runs, format, prompt_tokens, true, &app.limits));
    }
    let outputs = collect_all(runs).await?;
    let Some(out) = outputs.into_iter().next() else {
        return Err(ServerError::Internal("a response without output".into()));
    };
    let (thinking, text) = match valid.reasoning() {
        Some(how) => {
            let split = ReasoningSplit::whole(how, &out.text);
            (split.reasoning, split.content)
        }
        None => (String::new(), out.text),
    };
    let reply = match parser() {
        Some(p) => ParsedReply::parse(p, &text),
        None => ParsedReply {
            content: Some(text),
            calls: Vec::new(),
        },
    };
    let mut output = Vec::new();
    if !thinking.is_empty() {
        output.push(reasoning_item(
            &format!("rs_{}", random_id()),
            "completed",
            &thinking,
        ));
    }
    // An empty answer is a message only when nothing else was output.
    let nothing_else = reply.calls.is_empty() && thinking.is_empty();
    if let Some(text) = reply.content.filter(|t| !t.is_empty() || nothing_else) {
        // Log-probabilities are only served without tool calls (the request is refused
        // otherwise), so the whole output is this text.
        output.push(message_item(
            &format!("msg_{}", random_id()),
            "completed",
            Some((&text, &out.logprobs)),
        ));
    }
    for (name, arguments) in &reply.calls {
        output.push(function_call_item(
            &format!("fc_{}", random_id()),
            &new_call_id(),
            name,
            arguments,
            "completed",
        ));
    }
    let (status, incomplete) = status_of(out.finish_reason);
    let usage = OutputUsage {
        usage: Usage::new(prompt_tokens, out.completion_tokens),
        reasoning_tokens: thinking_tokens(&tokenizer, &thinking),
    };
    Ok(Json(header.object(status, output, Some(usage), incomplete)).into_response())
}

/// Tokens of the thinking, counted by tokenizing its text (the reply's tokens are not
/// kept apart by where they fell).
fn thinking_tokens(tokenizer: &Tokenizer, thinking: &str) -> usize {
    match thinking.is_empty() {
        true => 0,
        false => tokenizer.encode(thinking, false).map_or(0, |ids| ids.len()),
    }
}

/// The item being streamed.
enum OpenItem {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// The Responses event sequence of one streamed response.
pub struct ResponsesFormat {
    header: ResponseHeader,
    parser: Option<Box<dyn ToolCallParser>>,
    /// Splits the thinking from the answer, when replies are split.
    split: Option<ReasoningSplit>,
    /// All the thinking, counted in the usage.
    thinking: String,
    tokenizer: Arc<Tokenizer>,
    sequence: u64,
    open: Option<OpenItem>,
    done: Vec<Value>,
    finish_reason: &'static str,
}

impl ResponsesFormat {
    fn new(
        header: ResponseHeader,
        parser: Option<Box<dyn ToolCallParser>>,
        reasoning: Option<ReplySplit>,
        tokenizer: Arc<Tokenizer>,
    ) -> Self {
        ResponsesFormat {
            header,
            parser,
            split: reasoning.map(ReasoningSplit::new),
            thinking: String::new(),
            tokenizer,
            sequence: 0,
            open: None,
            done: Vec::new(),
            finish_reason: "stop",
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> String {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        to_json(&body)
    }

    fn output_index(&self) -> usize {
        self.done.len()
    }

    /// Ends the open item, if any.
    fn close(&mut self, out: &mut Vec<String>) {
        let index = self.output_index();
        match self.open.take() {
            None => {}
            Some(OpenItem::Reasoning { id, text }) => {
                let e = self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                out.push(e);
                let item = reasoning_item(&id, "completed", &text);
                let e = self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                out.push(e);
                self.done.push(item);
            }
            Some(OpenItem::Message { id, text, logprobs }) => {
                let e = self.event(
                    "response.output_text.done",
                    json!({
                        "item_id": id, "output_index": index, "content_index": 0, "text": text,
                        "logprobs": logprob_values(&logprobs),
                    }),
                );
                out.push(e);
                let e = self.event(
                    "response.content_part.done",
                    json!({
                        "item_id": id, "output_index": index, "content_index": 0,
                        "part": output_text_part(&text, &logprobs),
                    }),
                );
                out.push(e);
                let item = message_item(&id, "completed", Some((&text, &logprobs)));
                let e = self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                out.push(e);
                self.done.push(item);
            }
            Some(OpenItem::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                let e = self.event(
                    "response.function_call_arguments.done",
                    json!({
                        "item_id": id, "output_index": index, "name": name, "arguments": arguments,
                    }),
                );
                out.push(e);
                let item = function_call_item(&id, &call_id, &name, &arguments, "completed");
                let e = self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                out.push(e);
                self.done.push(item);
            }
        }
    }

    /// More thinking.
    fn reasoning_delta(&mut self, text: String, out: &mut Vec<String>) {
        if !matches!(self.open, Some(OpenItem::Reasoning { .. })) {
            self.close(out);
            let id = format!("rs_{}", random_id());
            let item = reasoning_item(&id, "in_progress", "");
            let index = self.output_index();
            let e = self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            out.push(e);
            self.open = Some(OpenItem::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.output_index();
        let Some(OpenItem::Reasoning { id, text: all }) = &mut self.open else {
            return;
        };
        all.push_str(&text);
        self.thinking.push_str(&text);
        let id = id.clone();
        let e = self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
        );
        out.push(e);
    }

    /// Split text: its thinking, then its answer.
    fn split_delta(&mut self, split: Split, out: &mut Vec<String>) {
        if !split.reasoning.is_empty() {
            self.reasoning_delta(split.reasoning, out);
        }
        self.answer_delta(split.content, &[], out);
    }

    /// Answer text: through the tool-call parser when calls may be in it.
    fn answer_delta(&mut self, text: String, logprobs: &[TokenLogprob], out: &mut Vec<String>) {
        match &mut self.parser {
            // No log-probabilities here: they are refused together with tools.
            Some(p) => {
                let events = p.push(&text);
                self.apply(events, out);
            }
            None if text.is_empty() && logprobs.is_empty() => {}
            None => self.text_delta(text, logprobs, out),
        }
    }

    /// More output text, with the log-probabilities of the tokens that made it.
    fn text_delta(&mut self, text: String, logprobs: &[TokenLogprob], out: &mut Vec<String>) {
        if !matches!(self.open, Some(OpenItem::Message { .. })) {
            self.close(out);
            let id = format!("msg_{}", random_id());
            let item = message_item(&id, "in_progress", None);
            let index = self.output_index();
            let e = self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            out.push(e);
            let e = self.event(
                "response.content_part.added",
                json!({
                    "item_id": id, "output_index": index, "content_index": 0,
                    "part": output_text_part("", &[]),
                }),
            );
            out.push(e);
            self.open = Some(OpenItem::Message {
                id,
                text: String::new(),
                logprobs: Vec::new(),
            });
        }
        let index = self.output_index();
        let Some(OpenItem::Message {
            id,
            text: all,
            logprobs: all_logprobs,
        }) = &mut self.open
        else {
            return;
        };
        all.push_str(&text);
        all_logprobs.extend_from_slice(logprobs);
        let id = id.clone();
        let e = self.event(
            "response.output_text.delta",
            json!({
                "item_id": id, "output_index": index, "content_index": 0, "delta": text,
                "logprobs": logprob_values(logprobs),
            }),
        );
        out.push(e);
    }

    fn apply(&mut self, events: Vec<ToolEvent>, out: &mut Vec<String>) {
        for event in events {
            let index = self.output_index();
            match event {
                ToolEvent::Content(text) => self.text_delta(text, &[], out),
                ToolEvent::CallStart { name, .. } => {
                    self.close(out);
                    let index = self.output_index();
                    let id = format!("fc_{}", random_id());
                    let call_id = new_call_id();
                    let item = function_call_item(&id, &call_id, &name, "", "in_progress");
                    let e = self.event(
                        "response.output_item.added",
                        json!({"output_index": index, "item": item}),
                    );
                    out.push(e);
                    self.open = Some(OpenItem::Call {
                        id,
                        call_id,
                        name,
                        arguments: String::new(),
                    });
                }
                ToolEvent::CallArguments { fragment, .. } => {
                    let id = match &mut self.open {
                        Some(OpenItem::Call { id, arguments, .. }) => {
                            arguments.push_str(&fragment);
                            id.clone()
                        }
                        _ => continue,
                    };
                    let e = self.event(
                        "response.function_call_arguments.delta",
                        json!({
                            "item_id": id, "output_index": index, "delta": fragment,
                        }),
                    );
                    out.push(e);
                }
            }
        }
    }
}

impl ChunkFormat for ResponsesFormat {
    /// OpenAI's Responses streams name each event after its type.
    fn named_events() -> bool {
        true
    }

    fn terminator(&self) -> Option<&'static str> {
        None
    }

    fn opening(&mut self, _choices: &[(usize, usize)]) -> Vec<String> {
        let response = self.header.object("in_progress", Vec::new(), None, None);
        let created = self.event("response.created", json!({"response": response}));
        let progress = self.event("response.in_progress", json!({"response": response}));
        vec![created, progress]
    }

    fn delta(&mut self, _index: usize, text: String, logprobs: &[TokenLogprob]) -> Vec<String> {
        let mut out = Vec::new();
        match self.split.as_mut().map(|s| s.push(&text)) {
            // No log-probabilities with a split: the request is refused.
            Some(split) => self.split_delta(split, &mut out),
            None => self.answer_delta(text, logprobs, &mut out),
        }
        out
    }

    fn finish(&mut self, _index: usize, end: &ChoiceEnd) -> Vec<String> {
        let reason = end.reason;
        let mut out = Vec::new();
        if let Some(rest) = self.split.as_mut().map(ReasoningSplit::finish) {
            self.split_delta(rest, &mut out);
        }
        if let Some(p) = &mut self.parser {
            let events = p.finish();
            self.apply(events, &mut out);
        }
        self.close(&mut out);
        self.finish_reason = reason;
        out
    }

    fn usage(&mut self, usage: Usage) -> String {
        let (status, incomplete) = status_of(self.finish_reason);
        let usage = OutputUsage {
            usage,
            reasoning_tokens: thinking_tokens(&self.tokenizer, &self.thinking),
        };
        let response = self.header.object(
            status,
            std::mem::take(&mut self.done),
            Some(usage),
            incomplete,
        );
        let kind = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.event(kind, json!({"response": response}))
    }
}
