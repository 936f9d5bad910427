//! Mistral's form: `[TOOL_CALLS]` and a JSON array of `{"name": ..., "arguments": ...}`.
//! `[TOOL_CALLS]` is a special token, which the detokenizer leaves out of the text, so a
//! reply that opens with an array of objects is read as calls too.

use crate::api::tool_parsers::call_array::CallArray;
use crate::api::tool_parsers::markers::{find_marker, ContentOut, MarkerScan};
use crate::api::tool_parsers::{ToolCallParser, ToolEvent};

const MARKER: &str = "[TOOL_CALLS]";

#[derive(Debug)]
enum State {
    Start,
    Text,
    Calls(CallArray),
}

#[derive(Debug)]
pub struct MistralParser {
    state: State,
    pending: String,
    content: ContentOut,
}

impl Default for MistralParser {
    fn default() -> Self {
        MistralParser {
            state: State::Start,
            pending: String::new(),
            content: ContentOut::default(),
        }
    }
}

impl MistralParser {
    fn run(&mut self, out: &mut Vec<ToolEvent>) {
        loop {
            match &mut self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() || MARKER.starts_with(trimmed) {
                        return;
                    }
                    let Some(after) = trimmed.strip_prefix('[') else {
                        self.state = State::Text;
                        continue;
                    };
                    let after = after.trim_start();
                    if after.is_empty() {
                        return;
                    }
                    if after.starts_with('{') {
                        let blanks = self.pending.len() - trimmed.len();
                        self.pending.drain(..blanks);
                        self.state = State::Calls(CallArray::default());
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Text => match find_marker(&self.pending, MARKER) {
                    MarkerScan::Found(at) => {
                        let before: String = self.pending.drain(..at + MARKER.len()).collect();
                        self.content.push(&before[..at], out);
                        self.state = State::Calls(CallArray::default());
                    }
                    MarkerScan::NotYet { safe } => {
                        let text: String = self.pending.drain(..safe).collect();
                        self.content.push(&text, out);
                        return;
                    }
                },
                State::Calls(calls) => {
                    let used = calls.feed(&self.pending, &mut self.content, out);
                    self.pending.drain(..used);
                    if calls.is_done() || calls.is_invalid() {
                        self.state = State::Text;
                    } else {
                        return;
                    }
                }
            }
        }
    }
}

impl ToolCallParser for MistralParser {
    fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.pending.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        if !matches!(self.state, State::Calls(_)) {
            self.content.push(&rest, &mut out);
        }
        self.content.finish(&mut out);
        out
    }
}
