//! The Hermes form (Qwen 2.5, Qwen 3): `<tool_call>{"name": ..., "arguments": ...}
//! </tool_call>`, any number of times, with content around the calls.

use crate::api::tools::parsers::call_object::CallObject;
use crate::api::tools::parsers::markers::{content_until, ContentOut};
use crate::api::tools::parsers::{ToolCallParser, ToolEvent};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug)]
enum State {
    Text,
    InCall {
        call: CallObject,
        index: Option<usize>,
    },
    AfterCall,
}

#[derive(Debug)]
pub struct HermesParser {
    state: State,
    pending: String,
    content: ContentOut,
}

impl Default for HermesParser {
    fn default() -> Self {
        HermesParser {
            state: State::Text,
            pending: String::new(),
            content: ContentOut::default(),
        }
    }
}

impl HermesParser {
    /// Processes `pending` as far as it can be decided.
    fn run(&mut self, out: &mut Vec<ToolEvent>) {
        loop {
            match &mut self.state {
                State::Text => {
                    if !content_until(&mut self.pending, OPEN, &mut self.content, out) {
                        return;
                    }
                    self.state = State::InCall {
                        call: CallObject::new(),
                        index: None,
                    };
                }
                State::InCall { call, index } => {
                    let used = call.feed(&self.pending);
                    self.pending.drain(..used);
                    if call.is_invalid() {
                        // Not a call after all: the marker and what followed are text.
                        let text = format!("{OPEN}{}{}", call.text(), self.pending);
                        self.pending = text;
                        self.state = State::Text;
                        let safe = self.pending.len().min(OPEN.len());
                        let head: String = self.pending.drain(..safe).collect();
                        self.content.push(&head, out);
                        continue;
                    }
                    let progress = call.take();
                    if let Some(name) = progress.name {
                        let i = self.content.call();
                        *index = Some(i);
                        out.push(ToolEvent::CallStart { index: i, name });
                    }
                    if let (Some(i), false) = (*index, progress.arguments.is_empty()) {
                        out.push(ToolEvent::CallArguments {
                            index: i,
                            fragment: progress.arguments,
                        });
                    }
                    if !call.is_complete() {
                        return;
                    }
                    if index.is_none() {
                        // A complete object with no name: text.
                        let text = format!("{OPEN}{}", call.text());
                        self.content.push(&text, out);
                        self.state = State::Text;
                    } else {
                        self.state = State::AfterCall;
                    }
                }
                State::AfterCall => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        return;
                    }
                    if trimmed.starts_with(CLOSE) {
                        let skip = self.pending.len() - trimmed.len() + CLOSE.len();
                        self.pending.drain(..skip);
                        self.state = State::Text;
                    } else if CLOSE.starts_with(trimmed) {
                        return;
                    } else {
                        // No closing tag: what follows is text again.
                        self.state = State::Text;
                    }
                }
            }
        }
    }
}

impl ToolCallParser for HermesParser {
    fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.pending.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        match std::mem::replace(&mut self.state, State::Text) {
            State::InCall { call, index: None } => {
                let text = format!("{OPEN}{}{}", call.text(), self.pending);
                self.content.push(&text, &mut out);
            }
            State::InCall { .. } => {}
            State::Text => {
                let rest = std::mem::take(&mut self.pending);
                self.content.push(&rest, &mut out);
            }
            State::AfterCall => {
                let rest = std::mem::take(&mut self.pending);
                if !CLOSE.starts_with(rest.trim_start()) {
                    self.content.push(&rest, &mut out);
                }
            }
        }
        self.pending.clear();
        self.content.finish(&mut out);
        out
    }
}
