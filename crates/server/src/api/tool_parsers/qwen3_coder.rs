//! Qwen3-Coder's form: each call in its own `<tool_call>` block, the function and each
//! parameter as tags, every value on its own lines,
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! with content before the calls. Its template writes objects and lists as JSON and
//! anything else as Python's `str()` of it, so values are typed by the tools' schemas
//! ([`ParamTypes`]). Each argument is sent once its value is closed.

use crate::api::tool_parsers::markers::{content_until, take_tag, take_until, ContentOut};
use crate::api::tool_parsers::param_types::{close_call, ParamTypes};
use crate::api::tool_parsers::{ToolCallParser, ToolEvent};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNCTION: (&str, &str) = ("<function=", "</function>");
const PARAMETER: (&str, &str) = ("<parameter=", "</parameter>");

#[derive(Debug)]
enum State {
    Text,
    /// After `<tool_call>`: `<function=`, then the name up to `>`. `held` is the text
    /// taken since the block opened, content again if no call follows.
    Function {
        held: String,
        named: bool,
    },
    /// Between parameters: the next `<parameter=`, or `</function>`.
    Params {
        index: usize,
        name: String,
        sent: usize,
    },
    /// A parameter's name (`key: None`, up to `>`), then its value up to `</parameter>`.
    Param {
        index: usize,
        name: String,
        sent: usize,
        key: Option<String>,
    },
    /// After `</function>`: the block's `</tool_call>`.
    Closing,
}

#[derive(Debug)]
pub struct Qwen3CoderParser {
    state: State,
    pending: String,
    content: ContentOut,
    types: ParamTypes,
}

impl Qwen3CoderParser {
    pub fn new(types: ParamTypes) -> Self {
        Qwen3CoderParser {
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
                    self.state = State::Function {
                        held: OPEN.into(),
                        named: false,
                    };
                }
                State::Function {
                    mut held,
                    named: false,
                } => match take_tag(&mut self.pending, &[FUNCTION.0], &mut held) {
                    Some(Some(_)) => {
                        self.state = State::Function { held, named: true };
                    }
                    None => {
                        self.state = State::Function { held, named: false };
                        return;
                    }
                    Some(None) => {
                        // Not a call: the block's opening is content.
                        self.content.push(&held, out);
                    }
                },
                State::Function { held, named: true } => match take_until(&mut self.pending, ">") {
                    Some(name) if !name.trim().is_empty() && !name.contains('<') => {
                        let index = self.content.call();
                        let name = name.trim().to_string();
                        out.push(ToolEvent::CallStart {
                            index,
                            name: name.clone(),
                        });
                        self.state = State::Params {
                            index,
                            name,
                            sent: 0,
                        };
                    }
                    Some(name) => {
                        self.content.push(&format!("{held}{name}>"), out);
                    }
                    None => {
                        self.state = State::Function { held, named: true };
                        return;
                    }
                },
                State::Params { index, name, sent } => {
                    let mut taken = String::new();
                    match take_tag(&mut self.pending, &[PARAMETER.0, FUNCTION.1], &mut taken) {
                        Some(Some(0)) => {
                            self.state = State::Param {
                                index,
                                name,
                                sent,
                                key: None,
                            }
                        }
                        Some(Some(_)) => {
                            out.push(close_call(index, sent));
                            self.state = State::Closing;
                        }
                        None => {
                            self.state = State::Params { index, name, sent };
                            return;
                        }
                        // Neither another parameter nor the end: the call ends here.
                        Some(None) => out.push(close_call(index, sent)),
                    }
                }
                State::Param {
                    index,
                    name,
                    sent,
                    key: None,
                } => match take_until(&mut self.pending, ">") {
                    Some(key) => {
                        self.state = State::Param {
                            index,
                            name,
                            sent,
                            key: Some(key.trim().to_string()),
                        }
                    }
                    None => {
                        self.state = State::Param {
                            index,
                            name,
                            sent,
                            key: None,
                        };
                        return;
                    }
                },
                State::Param {
                    index,
                    name,
                    sent,
                    key: Some(key),
                } => match take_until(&mut self.pending, PARAMETER.1) {
                    Some(raw) => {
                        // The template puts the value on lines of its own.
                        let raw = raw.strip_prefix('\n').unwrap_or(&raw);
                        let raw = raw.strip_suffix('\n').unwrap_or(raw);
                        out.push(ToolEvent::CallArguments {
                            index,
                            fragment: self.types.fragment(&name, &key, raw, sent),
                        });
                        self.state = State::Params {
                            index,
                            name,
                            sent: sent + 1,
                        };
                    }
                    None => {
                        self.state = State::Param {
                            index,
                            name,
                            sent,
                            key: Some(key),
                        };
                        return;
                    }
                },
                State::Closing => {
                    // With or without its closing tag, what follows is content.
                    if take_tag(&mut self.pending, &[CLOSE], &mut String::new()).is_none() {
                        self.state = State::Closing;
                        return;
                    }
                }
            }
        }
    }
}

impl ToolCallParser for Qwen3CoderParser {
    fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.pending.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => self.content.push(&rest, &mut out),
            State::Function { held, .. } => self.content.push(&format!("{held}{rest}"), &mut out),
            // A call cut off: its complete arguments stand.
            State::Params { index, sent, .. } | State::Param { index, sent, .. } => {
                out.push(close_call(index, sent))
            }
            State::Closing => {
                if !CLOSE.starts_with(rest.trim_start()) {
                    self.content.push(&rest, &mut out);
                }
            }
        }
        self.content.finish(&mut out);
        out
    }
}
