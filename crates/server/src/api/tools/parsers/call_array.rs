//! A JSON array of call objects, `[{"name": ..., "arguments": ...}, ...]`: Mistral's
//! form after `[TOOL_CALLS]`, and the form of forced calls.

use crate::api::tools::parsers::call_object::CallObject;
use crate::api::tools::parsers::markers::ContentOut;
use crate::api::tools::parsers::ToolEvent;

#[derive(Debug)]
enum State {
    ExpectOpen,
    ExpectItem,
    InItem {
        call: CallObject,
        index: Option<usize>,
    },
    AfterItem,
    Done,
    Invalid,
}

/// The array's reader. Feed it text; it says how much it used.
#[derive(Debug)]
pub struct CallArray {
    state: State,
}

impl Default for CallArray {
    fn default() -> Self {
        CallArray {
            state: State::ExpectOpen,
        }
    }
}

impl CallArray {
    /// Reads from `text`; gives the bytes used (the rest follows the array, or is not
    /// an array at all).
    pub fn feed(
        &mut self,
        text: &str,
        content: &mut ContentOut,
        out: &mut Vec<ToolEvent>,
    ) -> usize {
        let mut used = 0;
        loop {
            let rest = &text[used..];
            match &mut self.state {
                State::Done | State::Invalid => return used,
                State::InItem { call, index } => {
                    used += call.feed(rest);
                    let progress = call.take();
                    if let Some(name) = progress.name {
                        let i = content.call();
                        *index = Some(i);
                        out.push(ToolEvent::CallStart { index: i, name });
                    }
                    if let (Some(i), false) = (*index, progress.arguments.is_empty()) {
                        out.push(ToolEvent::CallArguments {
                            index: i,
                            fragment: progress.arguments,
                        });
                    }
                    if call.is_invalid() {
                        self.state = State::Invalid;
                    } else if call.is_complete() {
                        self.state = State::AfterItem;
                    } else {
                        return used;
                    }
                }
                _ => {
                    let trimmed = rest.trim_start();
                    used += rest.len() - trimmed.len();
                    let Some(c) = trimmed.chars().next() else {
                        return used;
                    };
                    let next = match (&self.state, c) {
                        (State::ExpectOpen, '[') => State::ExpectItem,
                        // The item's reader takes its opening brace itself.
                        (State::ExpectItem, '{') => State::InItem {
                            call: CallObject::new(),
                            index: None,
                        },
                        (State::AfterItem, ',') => State::ExpectItem,
                        (State::AfterItem | State::ExpectItem, ']') => State::Done,
                        _ => State::Invalid,
                    };
                    if matches!(next, State::Invalid) {
                        self.state = next;
                        return used;
                    }
                    if !matches!(next, State::InItem { .. }) {
                        used += 1;
                    }
                    self.state = next;
                }
            }
        }
    }

    /// No call has begun and the text is not an array of calls.
    pub fn is_invalid(&self) -> bool {
        matches!(self.state, State::Invalid)
    }

    /// The closing bracket was read.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether the array has been opened.
    pub fn is_open(&self) -> bool {
        !matches!(self.state, State::ExpectOpen | State::Invalid)
    }
}
