//! GLM-4.5's form (GLM-4.5, GLM-4.5-Air, GLM-4.6): a call is the function's name and then
//! its arguments as key/value tags,
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! </tool_call>
//! ```
//!
//! any number of times, with content around the calls. Its template writes a string
//! argument as bare text and any other value as JSON, so values are typed by the tools'
//! schemas ([`ParamTypes`]). Each argument is sent once its value is closed.

use crate::api::tools::parsers::markers::{content_until, take_tag, take_until, ContentOut};
use crate::api::tools::parsers::param_types::{close_call, ParamTypes};
use crate::api::tools::parsers::{ToolCallParser, ToolEvent};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEY: (&str, &str) = ("<arg_key>", "</arg_key>");
const VALUE: (&str, &str) = ("<arg_value>", "</arg_value>");

/// The markers of the form, which GLM's vocabularies may hold as special tokens.
pub const MARKERS: [&str; 6] = [OPEN, CLOSE, KEY.0, KEY.1, VALUE.0, VALUE.1];

#[derive(Debug)]
enum State {
    Text,
    /// After `<tool_call>`: the function's name, up to a line end or the first tag.
    Name,
    /// Between arguments: the next `<arg_key>`, or `</tool_call>`.
    Args {
        index: usize,
        name: String,
        sent: usize,
    },
    Key {
        index: usize,
        name: String,
        sent: usize,
    },
    /// After a key: its `<arg_value>`, then the value up to `</arg_value>`.
    Value {
        index: usize,
        name: String,
        sent: usize,
        key: String,
        open: bool,
    },
}

#[derive(Debug)]
pub struct Glm45Parser {
    state: State,
    pending: String,
    content: ContentOut,
    types: ParamTypes,
}

impl Glm45Parser {
    pub fn new(types: ParamTypes) -> Self {
        Glm45Parser {
            state: State::Text,
            pending: String::new(),
            content: ContentOut::default(),
            types,
        }
    }

    /// Processes `pending` as far as it can be decided.
    fn run(&mut self, out: &mut Vec<ToolEvent>) {
        loop {
            match std::mem::replace(&mut self.state, State::Text) {
                State::Text => {
                    if !content_until(&mut self.pending, OPEN, &mut self.content, out) {
                        return;
                    }
                    self.state = State::Name;
                }
                State::Name => {
                    let end = ["\n", KEY.0, CLOSE]
                        .iter()
                        .filter_map(|m| self.pending.find(m))
                        .min();
                    let Some(end) = end else {
                        self.state = State::Name;
                        return;
                    };
                    let name = self.pending[..end].trim().to_string();
                    if name.is_empty() || name.contains('<') {
                        // Not a call: the marker and the text are content.
                        let text = format!("{OPEN}{}", self.pending);
                        self.pending = text;
                        let head: String = self.pending.drain(..OPEN.len()).collect();
                        self.content.push(&head, out);
                        continue;
                    }
                    self.pending.drain(..end);
                    let index = self.content.call();
                    out.push(ToolEvent::CallStart {
                        index,
                        name: name.clone(),
                    });
                    self.state = State::Args {
                        index,
                        name,
                        sent: 0,
                    };
                }
                State::Args { index, name, sent } => {
                    match take_tag(&mut self.pending, &[KEY.0, CLOSE], &mut String::new()) {
                        Some(Some(0)) => self.state = State::Key { index, name, sent },
                        None => {
                            self.state = State::Args { index, name, sent };
                            return;
                        }
                        // The end of the call, or neither another argument nor the end: the
                        // call ends here and what follows is content.
                        Some(_) => self.close(index, sent, out),
                    }
                }
                State::Key { index, name, sent } => match take_until(&mut self.pending, KEY.1) {
                    Some(key) => {
                        self.state = State::Value {
                            index,
                            name,
                            sent,
                            key: key.trim().to_string(),
                            open: false,
                        }
                    }
                    None => {
                        self.state = State::Key { index, name, sent };
                        return;
                    }
                },
                State::Value {
                    index,
                    name,
                    sent,
                    key,
                    open: false,
                } => match take_tag(&mut self.pending, &[VALUE.0], &mut String::new()) {
                    Some(Some(_)) => {
                        self.state = State::Value {
                            index,
                            name,
                            sent,
                            key,
                            open: true,
                        }
                    }
                    None => {
                        self.state = State::Value {
                            index,
                            name,
                            sent,
                            key,
                            open: false,
                        };
                        return;
                    }
                    Some(None) => self.close(index, sent, out),
                },
                State::Value {
                    index,
                    name,
                    sent,
                    key,
                    open: true,
                } => match take_until(&mut self.pending, VALUE.1) {
                    Some(raw) => {
                        out.push(ToolEvent::CallArguments {
                            index,
                            fragment: self.types.fragment(&name, &key, &raw, sent),
                        });
                        self.state = State::Args {
                            index,
                            name,
                            sent: sent + 1,
                        };
                    }
                    None => {
                        self.state = State::Value {
                            index,
                            name,
                            sent,
                            key,
                            open: true,
                        };
                        return;
                    }
                },
            }
        }
    }

    /// Ends call `index` after its `sent` arguments.
    fn close(&mut self, index: usize, sent: usize, out: &mut Vec<ToolEvent>) {
        out.push(close_call(index, sent));
        self.state = State::Text;
    }
}

impl ToolCallParser for Glm45Parser {
    fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.pending.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => {
                let rest = std::mem::take(&mut self.pending);
                self.content.push(&rest, &mut out);
            }
            State::Name => {
                // A name that never ended: the call, if it is one, has no arguments.
                let name = self.pending.trim().to_string();
                if name.is_empty() || name.contains('<') {
                    let text = format!("{OPEN}{}", self.pending);
                    self.content.push(&text, &mut out);
                } else {
                    let index = self.content.call();
                    out.push(ToolEvent::CallStart { index, name });
                    self.close(index, 0, &mut out);
                }
            }
            // A call cut off: its complete arguments stand.
            State::Args { index, sent, .. }
            | State::Key { index, sent, .. }
            | State::Value { index, sent, .. } => self.close(index, sent, &mut out),
        }
        self.pending.clear();
        self.content.finish(&mut out);
        out
    }
}
