//! Mistral's forms, both after the `[TOOL_CALLS]` marker:
//! - templates up to v7: a JSON array of `{"name": ..., "arguments": ...}`;
//! - v11+ templates: `name[ARGS]{...}`, the marker repeated before each call (v13 puts
//!   `[CALL_ID]id` between the name and `[ARGS]`; the id is not kept, the server names
//!   its calls itself).
//!
//! The markers are special tokens; the server keeps them in the text this parser reads
//! (`ToolOutput::marker_ids`). A tokenizer that does not know them drops nothing, and
//! where the marker was dropped anyway, a reply that opens with an array of objects is
//! read as calls too.

use crate::api::tools::parsers::call_array::CallArray;
use crate::api::tools::parsers::markers::{content_until, find_marker, ContentOut, MarkerScan};
use crate::api::tools::parsers::value_scan::ValueScan;
use crate::api::tools::parsers::{ToolCallParser, ToolEvent};

const MARKER: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

#[derive(Debug)]
enum State {
    Start,
    Text,
    /// Just past `[TOOL_CALLS]`: which form follows is not known yet.
    AfterMarker,
    /// The array form.
    Calls(CallArray),
    /// The v11 form: the function name so far, up to `[ARGS]` or `[CALL_ID]`.
    Name(String),
    /// The v13 call id of function `.0`, up to `[ARGS]`.
    CallId(String),
    /// Past `[ARGS]`: the arguments object of function `.0` opens next.
    ExpectArgs(String),
    /// The arguments object of call `index`.
    Args {
        index: usize,
        scan: ValueScan,
    },
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

/// Characters of a function name in the v11 form.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// What the v11 name scan found at the start of `text`.
enum NameEnd {
    /// More text is needed to tell.
    Wait,
    /// `[ARGS]` (or, with `[CALL_ID]`, the id and then `[ARGS]`), this many bytes long.
    Args(usize),
    CallId(usize),
    /// The arguments open right after the name (a tokenizer that dropped `[ARGS]`).
    Brace,
    /// Not the v11 form.
    Invalid,
}

fn name_end(text: &str) -> NameEnd {
    if text.starts_with(ARGS) {
        NameEnd::Args(ARGS.len())
    } else if text.starts_with(CALL_ID) {
        NameEnd::CallId(CALL_ID.len())
    } else if text.starts_with('{') {
        NameEnd::Brace
    } else if ARGS.starts_with(text) || CALL_ID.starts_with(text) {
        NameEnd::Wait
    } else {
        NameEnd::Invalid
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
                State::Text => {
                    if !content_until(&mut self.pending, MARKER, &mut self.content, out) {
                        return;
                    }
                    self.state = State::AfterMarker;
                }
                State::AfterMarker => {
                    let trimmed = self.pending.trim_start();
                    let Some(first) = trimmed.chars().next() else {
                        return;
                    };
                    let blanks = self.pending.len() - trimmed.len();
                    self.pending.drain(..blanks);
                    self.state = if first == '[' {
                        State::Calls(CallArray::default())
                    } else {
                        State::Name(String::new())
                    };
                }
                State::Calls(calls) => {
                    let used = calls.feed(&self.pending, &mut self.content, out);
                    self.pending.drain(..used);
                    if calls.is_done() || calls.is_invalid() {
                        self.state = State::Text;
                    } else {
                        return;
                    }
                }
                State::Name(name) => {
                    let chars = self.pending.find(|c| !is_name_char(c));
                    let taken = chars.unwrap_or(self.pending.len());
                    name.extend(self.pending.drain(..taken));
                    if chars.is_none() {
                        return;
                    }
                    let name = std::mem::take(name);
                    self.state = match name_end(&self.pending) {
                        NameEnd::Wait => State::Name(name),
                        NameEnd::Args(len) => {
                            self.pending.drain(..len);
                            State::ExpectArgs(name)
                        }
                        NameEnd::CallId(len) => {
                            self.pending.drain(..len);
                            State::CallId(name)
                        }
                        NameEnd::Brace if !name.is_empty() => State::ExpectArgs(name),
                        NameEnd::Brace | NameEnd::Invalid => self.not_a_call(&name),
                    };
                    if matches!(&self.state, State::Name(_)) {
                        return;
                    }
                }
                State::CallId(name) => match find_marker(&self.pending, ARGS) {
                    MarkerScan::Found(at) => {
                        self.pending.drain(..at + ARGS.len());
                        self.state = State::ExpectArgs(std::mem::take(name));
                    }
                    MarkerScan::NotYet { safe } => {
                        self.pending.drain(..safe);
                        return;
                    }
                },
                State::ExpectArgs(name) => {
                    let trimmed = self.pending.trim_start();
                    let Some(first) = trimmed.chars().next() else {
                        return;
                    };
                    let name = std::mem::take(name);
                    if first != '{' {
                        self.state = self.not_a_call(&name);
                        continue;
                    }
                    let blanks = self.pending.len() - trimmed.len();
                    self.pending.drain(..blanks);
                    let index = self.content.call();
                    out.push(ToolEvent::CallStart { index, name });
                    self.state = State::Args {
                        index,
                        scan: ValueScan::default(),
                    };
                }
                State::Args { index, scan } => {
                    let used = scan.feed(&self.pending);
                    if used > 0 {
                        out.push(ToolEvent::CallArguments {
                            index: *index,
                            fragment: self.pending.drain(..used).collect(),
                        });
                    }
                    if scan.is_done() {
                        self.state = State::Text;
                    } else {
                        return;
                    }
                }
            }
        }
    }

    /// What followed a marker is not a call: its text (the marker dropped) is content.
    fn not_a_call(&mut self, name: &str) -> State {
        self.pending.insert_str(0, name);
        State::Text
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
        // A call cut short keeps what it wrote; text of a call that never began is not
        // content.
        if matches!(self.state, State::Start | State::Text) {
            self.content.push(&rest, &mut out);
        }
        self.content.finish(&mut out);
        out
    }
}
