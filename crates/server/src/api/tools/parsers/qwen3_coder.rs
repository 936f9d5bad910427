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

use crate::api::tools::parsers::markers::{content_until, take_tag, take_until, ContentOut};
use crate::api::tools::parsers::param_types::ParamTypes;
use crate::api::tools::parsers::tagged_args::{ArgTags, ArgsEnd, TaggedArgs};
use crate::api::tools::parsers::{ToolCallParser, ToolEvent};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNCTION: (&str, &str) = ("<function=", "</function>");
const ARGS: ArgTags = ArgTags {
    open: "<parameter=",
    close: "</parameter>",
    end: FUNCTION.1,
    key: |k| k.trim().to_string(),
    // The template puts the value on lines of its own.
    value: |v| {
        let v = v.strip_prefix('\n').unwrap_or(v);
        v.strip_suffix('\n').unwrap_or(v)
    },
};

#[derive(Debug)]
enum State {
    Text,
    /// After `<tool_call>`: `<function=`, then the name up to `>`. `held` is the text
    /// taken since the block opened, content again if no call follows.
    Function {
        held: String,
        named: bool,
    },
    /// The call's arguments, up to `</function>`.
    Args(TaggedArgs),
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
                        self.state = State::Args(TaggedArgs::new(index, name));
                    }
                    Some(name) => {
                        self.content.push(&format!("{held}{name}>"), out);
                    }
                    None => {
                        self.state = State::Function { held, named: true };
                        return;
                    }
                },
                State::Args(mut args) => {
                    match args.run(&mut self.pending, &ARGS, &self.types, out) {
                        Some(ArgsEnd::Closed) => self.state = State::Closing,
                        // Neither another parameter nor the end: the call ends here.
                        Some(ArgsEnd::Broken) => {}
                        None => {
                            self.state = State::Args(args);
                            return;
                        }
                    }
                }
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
            State::Args(args) => args.finish(&mut out),
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
