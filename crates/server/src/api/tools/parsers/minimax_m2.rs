//! MiniMax-M2's form (M2, M2.1 and M2.5): one `<minimax:tool_call>` block holding a call
//! per `<invoke>`, each parameter in its own tag,
//!
//! ```text
//! <minimax:tool_call>
//! <invoke name="get_weather">
//! <parameter name="city">Paris</parameter>
//! <parameter name="days">3</parameter>
//! </invoke>
//! </minimax:tool_call>
//! ```
//!
//! with content before the block. Names may be quoted or not. Values are bare text,
//! trimmed (as MiniMax's own parser trims them), and typed by the tools' schemas
//! ([`ParamTypes`]): objects and lists are written as JSON. Each argument is sent once its
//! value is closed.

use crate::api::tools::parsers::markers::{content_until, take_tag, take_until, ContentOut};
use crate::api::tools::parsers::param_types::ParamTypes;
use crate::api::tools::parsers::tagged_args::{ArgTags, ArgsEnd, TaggedArgs};
use crate::api::tools::parsers::{ToolCallParser, ToolEvent};

const OPEN: &str = "<minimax:tool_call>";
const CLOSE: &str = "</minimax:tool_call>";
const INVOKE: (&str, &str) = ("<invoke name=", "</invoke>");
const ARGS: ArgTags = ArgTags {
    open: "<parameter name=",
    close: "</parameter>",
    end: INVOKE.1,
    key: unquote,
    value: str::trim,
};

/// The special tokens of the form, which the detokenizer must keep.
pub const MARKERS: [&str; 2] = [OPEN, CLOSE];

#[derive(Debug)]
enum State {
    Text,
    /// Inside a block, between calls: the next `<invoke name=`, or the block's end.
    /// `held` is the text taken since the block opened while it has no call (`called`
    /// false), content again if none follows.
    Block {
        held: String,
        called: bool,
    },
    /// A call's name, up to `>`.
    Name {
        held: String,
    },
    /// The call's arguments, up to `</invoke>`.
    Args(TaggedArgs),
}

#[derive(Debug)]
pub struct MiniMaxM2Parser {
    state: State,
    pending: String,
    content: ContentOut,
    types: ParamTypes,
}

/// A name as written, quoted or not.
fn unquote(text: &str) -> String {
    let t = text.trim();
    let quoted = |q: char| t.len() >= 2 && t.starts_with(q) && t.ends_with(q);
    match quoted('"') || quoted('\'') {
        true => t[1..t.len() - 1].to_string(),
        false => t.to_string(),
    }
}

impl MiniMaxM2Parser {
    pub fn new(types: ParamTypes) -> Self {
        MiniMaxM2Parser {
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
                    self.state = State::Block {
                        held: OPEN.into(),
                        called: false,
                    };
                }
                State::Block { mut held, called } => {
                    match take_tag(&mut self.pending, &[INVOKE.0, CLOSE], &mut held) {
                        Some(Some(0)) => self.state = State::Name { held },
                        // The block ends; what follows is content.
                        Some(Some(_)) => {}
                        None => {
                            self.state = State::Block { held, called };
                            return;
                        }
                        // Not a call: a block that opened none is content.
                        Some(None) if !called => self.content.push(&held, out),
                        Some(None) => {}
                    }
                }
                State::Name { held } => match take_until(&mut self.pending, ">") {
                    Some(raw) if !unquote(&raw).is_empty() && !raw.contains('<') => {
                        let index = self.content.call();
                        let name = unquote(&raw);
                        out.push(ToolEvent::CallStart {
                            index,
                            name: name.clone(),
                        });
                        self.state = State::Args(TaggedArgs::new(index, name));
                    }
                    Some(raw) => self.content.push(&format!("{held}{raw}>"), out),
                    None => {
                        self.state = State::Name { held };
                        return;
                    }
                },
                State::Args(mut args) => {
                    match args.run(&mut self.pending, &ARGS, &self.types, out) {
                        // Another call may follow in the block.
                        Some(ArgsEnd::Closed) => {
                            self.state = State::Block {
                                held: String::new(),
                                called: true,
                            }
                        }
                        // Neither another parameter nor the end: the call ends here.
                        Some(ArgsEnd::Broken) => {}
                        None => {
                            self.state = State::Args(args);
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl ToolCallParser for MiniMaxM2Parser {
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
            State::Block {
                held,
                called: false,
            }
            | State::Name { held } => self.content.push(&format!("{held}{rest}"), &mut out),
            // The block cut off between calls, or its end not written: nothing more.
            State::Block { .. } => {}
            // A call cut off: its complete arguments stand.
            State::Args(args) => args.finish(&mut out),
        }
        self.content.finish(&mut out);
        out
    }
}
