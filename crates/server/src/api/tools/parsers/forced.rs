//! Readers of forced calls: the output the grammar of `tool_choice` `required` (a JSON
//! array of calls) or a named function (the arguments object) allowed.

use crate::api::tools::parsers::call_array::CallArray;
use crate::api::tools::parsers::markers::ContentOut;
use crate::api::tools::parsers::{ToolCallParser, ToolEvent};

/// `required`: `[{"name": ..., "arguments": {...}}, ...]`.
#[derive(Debug, Default)]
pub struct ForcedArrayParser {
    calls: CallArray,
    pending: String,
    content: ContentOut,
}

impl ToolCallParser for ForcedArrayParser {
    fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.pending.push_str(text);
        let used = self.calls.feed(&self.pending, &mut self.content, &mut out);
        self.pending.drain(..used);
        if self.calls.is_done() || self.calls.is_invalid() {
            // Nothing follows the array under the grammar; keep anything that does.
            let rest = std::mem::take(&mut self.pending);
            self.content.push(&rest, &mut out);
        }
        out
    }

    fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        if !self.calls.is_open() || self.calls.is_done() {
            self.content.push(&rest, &mut out);
        }
        self.content.finish(&mut out);
        out
    }
}

/// A named function: the whole output is its arguments.
#[derive(Debug)]
pub struct ForcedNamedParser {
    name: String,
    started: bool,
}

impl ForcedNamedParser {
    pub fn new(name: String) -> Self {
        ForcedNamedParser {
            name,
            started: false,
        }
    }

    fn start(&mut self, out: &mut Vec<ToolEvent>) {
        if !self.started {
            self.started = true;
            out.push(ToolEvent::CallStart {
                index: 0,
                name: self.name.clone(),
            });
        }
    }
}

impl ToolCallParser for ForcedNamedParser {
    fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        if text.is_empty() {
            return out;
        }
        self.start(&mut out);
        out.push(ToolEvent::CallArguments {
            index: 0,
            fragment: text.to_string(),
        });
        out
    }

    fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.start(&mut out);
        out
    }
}
