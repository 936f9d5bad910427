//! gpt-oss's replies in OpenAI's harmony format, split as they stream. A reply is a run
//! of messages, each a header and a body:
//!
//! ```text
//! <|channel|>analysis<|message|>The user asks ...<|end|>
//! <|start|>assistant<|channel|>final<|message|>Paris.<|return|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//! ```
//!
//! (the first header's `<|start|>assistant` is the prompt's last text). The `analysis`
//! channel is thinking; `final`, and `commentary` addressed to no one (a preamble to the
//! user), are the answer; a message addressed `to=functions.NAME` (in the header, before
//! or after the channel) is a call of NAME whose arguments are the body. Calls go on to
//! the tool parser in the Hermes form (`<tool_call>{"name": .., "arguments": ..}
//! </tool_call>`), which the server reads for templates without a form of their own.
//!
//! The markers are special tokens, kept in the text this split reads; `<|return|>` and
//! `<|call|>` end the generation, so a body also ends with the text. A reply with no
//! header at all (the markers were not kept, or a constraint wrote it) is all answer.

use super::split::Split;

pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
pub const CONSTRAIN: &str = "<|constrain|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";

/// The markers the split must see in the text (the others end the generation).
pub const KEPT_MARKERS: [&str; 5] = [START, CHANNEL, MESSAGE, END, CONSTRAIN];

/// What ends a body.
const BODY_ENDS: [&str; 4] = [END, START, CALL, RETURN];

/// Where a message's body goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call of this function.
    Call,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    Body(Body),
}

/// The harmony split of one reply.
#[derive(Debug, Clone)]
pub struct HarmonySplit {
    state: State,
    pending: String,
    /// Whether any header was read: a reply without one is plain answer text.
    saw_header: bool,
}

impl Default for HarmonySplit {
    fn default() -> Self {
        HarmonySplit {
            state: State::Header,
            pending: String::new(),
            saw_header: false,
        }
    }
}

impl HarmonySplit {
    /// The split of the text so far that can no longer change.
    pub fn push(&mut self, text: &str) -> Split {
        self.pending.push_str(text);
        let mut out = Split::default();
        loop {
            match &self.state {
                State::Header => {
                    let Some(at) = self.pending.find(MESSAGE) else {
                        return out;
                    };
                    let header: String = self.pending.drain(..at + MESSAGE.len()).collect();
                    let body = read_header(&header[..at]);
                    self.saw_header = true;
                    if let (Body::Call, Some(name)) = (&body, recipient_function(&header)) {
                        out.content.push_str(&format!(
                            "<tool_call>{{\"name\": {}, \"arguments\": ",
                            serde_json::Value::String(name.to_string())
                        ));
                    }
                    self.state = State::Body(body);
                }
                State::Body(body) => {
                    let body = body.clone();
                    let end = BODY_ENDS
                        .iter()
                        .filter_map(|m| self.pending.find(m).map(|at| (at, m.len())))
                        .min();
                    match end {
                        Some((at, len)) => {
                            let text: String = self.pending.drain(..at).collect();
                            self.pending.drain(..len);
                            emit(&mut out, &body, &text, true);
                            self.state = State::Header;
                        }
                        None => {
                            let keep = held_marker_prefix(&self.pending);
                            let release = self.pending.len() - keep;
                            let text: String = self.pending.drain(..release).collect();
                            emit(&mut out, &body, &text, false);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The rest, once the reply ended: an open body ends with the text; header text is
    /// the answer if no header came before it (a reply without harmony markers) and
    /// dropped otherwise (a header cut off).
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Split::default();
        match std::mem::replace(&mut self.state, State::Header) {
            State::Body(body) => emit(&mut out, &body, &rest, true),
            State::Header if !self.saw_header && !rest.contains("<|") => out.content = rest,
            State::Header => {}
        }
        out
    }
}

/// Text of a body to its place; `ends`: the body ends after it.
fn emit(out: &mut Split, body: &Body, text: &str, ends: bool) {
    match body {
        Body::Reasoning => out.reasoning.push_str(text),
        Body::Content => out.content.push_str(text),
        Body::Call => {
            out.content.push_str(text);
            if ends {
                out.content.push_str("}</tool_call>");
            }
        }
    }
}

/// Where the body of a message with this header goes.
fn read_header(header: &str) -> Body {
    if recipient(header).is_some() {
        return match recipient_function(header) {
            Some(_) => Body::Call,
            // A built-in tool's call (`browser.search`, `python`): not served here, so its
            // text is shown as it is.
            None => Body::Content,
        };
    }
    let channel = header
        .split_once(CHANNEL)
        .map(|(_, rest)| rest.split([' ', '<']).next().unwrap_or(""));
    match channel {
        Some("analysis") => Body::Reasoning,
        _ => Body::Content,
    }
}

/// The `to=` recipient of a header.
fn recipient(header: &str) -> Option<&str> {
    let (_, rest) = header.split_once("to=")?;
    rest.split([' ', '<']).next().filter(|r| !r.is_empty())
}

/// The function a header's `to=functions.NAME` calls.
fn recipient_function(header: &str) -> Option<&str> {
    recipient(header)?
        .strip_prefix("functions.")
        .filter(|n| !n.is_empty())
}

/// Length of the suffix of `text` that may be the start of a marker ending a body.
fn held_marker_prefix(text: &str) -> usize {
    BODY_ENDS
        .iter()
        .filter_map(|m| (1..m.len()).rev().find(|&n| text.ends_with(&m[..n])))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use crate::api::reasoning::tests::streamed_as_whole;
    use crate::api::reasoning::{ReplySplit, Split};

    fn split(reasoning: &str, content: &str) -> Split {
        Split {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    #[test]
    fn channels_are_split_streamed_or_whole() {
        let call = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\
                    </tool_call>";
        let cases = [
            (
                "<|channel|>analysis<|message|>User wants the capital.<|end|><|start|>assistant\
                 <|channel|>final<|message|>Paris.",
                split("User wants the capital.", "Paris."),
            ),
            // A call, the recipient after the channel, then before it.
            (
                "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant\
                 <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                 {\"city\":\"Paris\"}",
                split("Need weather.", call),
            ),
            (
                "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant \
                 to=functions.get_weather<|channel|>commentary json<|message|>\
                 {\"city\":\"Paris\"}",
                split("Need weather.", call),
            ),
            // A preamble to the user, then a call.
            (
                "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant\
                 <|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Paris\"}",
                split("", &format!("Checking.{call}")),
            ),
            // Cut off by max_tokens while thinking, and while writing a header.
            (
                "<|channel|>analysis<|message|>Let me <|e",
                split("Let me <|e", ""),
            ),
            (
                "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|chan",
                split("Hm.", ""),
            ),
            // No markers: everything is the answer; markers' look-alikes in a body stay.
            ("Just text.", split("", "Just text.")),
            (
                "<|channel|>final<|message|>a <| b < c",
                split("", "a <| b < c"),
            ),
            // A built-in tool's call is shown as text.
            (
                "<|channel|>analysis to=browser.search<|message|>{\"query\":\"x\"}",
                split("", "{\"query\":\"x\"}"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                streamed_as_whole(ReplySplit::Harmony, text),
                want,
                "{text:?}"
            );
        }
    }
}
