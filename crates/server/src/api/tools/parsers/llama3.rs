//! Llama 3.x's JSON form: the reply is one call object, `{"name": ..., "parameters":
//! ...}` (`<|python_tag|>`, a special token, may open it and is not in the text), or
//! several separated by `;`. A reply that does not start with `{` is content.

use crate::api::tools::parsers::call_object::CallObject;
use crate::api::tools::parsers::markers::ContentOut;
use crate::api::tools::parsers::{ToolCallParser, ToolEvent};

#[derive(Debug)]
enum State {
    Start,
    Content,
    InCall {
        call: CallObject,
        index: Option<usize>,
    },
    Between,
}

#[derive(Debug)]
pub struct Llama3JsonParser {
    state: State,
    pending: String,
    content: ContentOut,
}

impl Default for Llama3JsonParser {
    fn default() -> Self {
        Llama3JsonParser {
            state: State::Start,
            pending: String::new(),
            content: ContentOut::default(),
        }
    }
}

impl Llama3JsonParser {
    fn run(&mut self, out: &mut Vec<ToolEvent>) {
        loop {
            match &mut self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        return;
                    }
                    if trimmed.starts_with('{') {
                        let blanks = self.pending.len() - trimmed.len();
                        self.pending.drain(..blanks);
                        self.state = State::InCall {
                            call: CallObject::new(),
                            index: None,
                        };
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Content => {
                    let text = std::mem::take(&mut self.pending);
                    self.content.push(&text, out);
                    return;
                }
                State::InCall { call, index } => {
                    let used = call.feed(&self.pending);
                    self.pending.drain(..used);
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
                        // JSON without a name: an ordinary reply.
                        let text = format!("{}{}", call.text(), self.pending);
                        self.pending = text;
                        self.state = State::Content;
                    } else {
                        self.state = State::Between;
                    }
                }
                State::Between => {
                    let trimmed = self
                        .pending
                        .trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    if trimmed.is_empty() {
                        return;
                    }
                    let skip = self.pending.len() - trimmed.len();
                    if trimmed.starts_with('{') {
                        self.pending.drain(..skip);
                        self.state = State::InCall {
                            call: CallObject::new(),
                            index: None,
                        };
                    } else {
                        self.state = State::Content;
                    }
                }
            }
        }
    }
}

impl ToolCallParser for Llama3JsonParser {
    fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.pending.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        match std::mem::replace(&mut self.state, State::Content) {
            State::InCall { call, index: None } => {
                self.content
                    .push(&format!("{}{rest}", call.text()), &mut out);
            }
            State::InCall { .. } => {}
            State::Between
                if rest
                    .trim_matches(|c: char| c.is_whitespace() || c == ';')
                    .is_empty() => {}
            State::Start | State::Content | State::Between => self.content.push(&rest, &mut out),
        }
        self.content.finish(&mut out);
        out
    }
}
