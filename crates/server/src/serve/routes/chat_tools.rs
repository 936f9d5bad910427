//! Tool calls in chat replies: a whole reply's `message.tool_calls`, and the
//! `delta.tool_calls` of a stream, both from the same parser events.

use crate::api::response::{
    AssistantMessage, ChatDelta, FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta,
};
use crate::api::tools::parsers::{ParsedReply, ToolCallParser, ToolEvent};
use crate::api::tools::prompt::ToolOutput;
use crate::serve::state::random_id;

/// A fresh call id, `call_` and 24 random characters.
pub fn new_call_id() -> String {
    format!("call_{}", random_id())
}

/// The finish reason of a reply: `tool_calls` when it made calls and ended by itself.
pub fn finish_reason(reason: &'static str, made_calls: bool) -> &'static str {
    if made_calls && reason == "stop" {
        "tool_calls"
    } else {
        reason
    }
}

/// The message of a whole reply, and whether it made calls.
pub fn reply_message(output: Option<&ToolOutput>, text: String) -> (AssistantMessage, bool) {
    let Some(output) = output else {
        let message = AssistantMessage {
            role: "assistant",
            content: Some(text),
            reasoning: None,
            tool_calls: Vec::new(),
        };
        return (message, false);
    };
    let reply = ParsedReply::parse(output.parser(), &text);
    let tool_calls: Vec<ToolCall> = reply
        .calls
        .into_iter()
        .map(|(name, arguments)| ToolCall {
            id: new_call_id(),
            kind: "function",
            function: FunctionCall { name, arguments },
        })
        .collect();
    let made_calls = !tool_calls.is_empty();
    let content = match reply.content {
        Some(c) => Some(c),
        None if made_calls => None,
        None => Some(String::new()),
    };
    let message = AssistantMessage {
        role: "assistant",
        content,
        reasoning: None,
        tool_calls,
    };
    (message, made_calls)
}

/// One streamed choice's parser and the ids of its calls.
pub struct StreamedCalls {
    parser: Box<dyn ToolCallParser>,
    calls: usize,
}

impl StreamedCalls {
    pub fn new(output: &ToolOutput) -> Self {
        StreamedCalls {
            parser: output.parser(),
            calls: 0,
        }
    }

    /// Whether a call has started.
    pub fn made_calls(&self) -> bool {
        self.calls > 0
    }

    /// The deltas for more text.
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        let events = self.parser.push(text);
        self.deltas(events)
    }

    /// The deltas of whatever the parser held back.
    pub fn finish(&mut self) -> Vec<ChatDelta> {
        let events = self.parser.finish();
        self.deltas(events)
    }

    /// One delta per event; argument fragments of one call that follow each other
    /// are joined.
    fn deltas(&mut self, events: Vec<ToolEvent>) -> Vec<ChatDelta> {
        let mut out: Vec<ChatDelta> = Vec::new();
        for event in events {
            match event {
                ToolEvent::Content(text) => out.push(ChatDelta {
                    content: Some(text),
                    ..ChatDelta::default()
                }),
                ToolEvent::CallStart { index, name } => {
                    self.calls += 1;
                    out.push(call_delta(ToolCallDelta {
                        index,
                        id: Some(new_call_id()),
                        kind: Some("function"),
                        function: FunctionCallDelta {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    }));
                }
                ToolEvent::CallArguments { index, fragment } => {
                    let joined =
                        out.last_mut()
                            .and_then(|d| d.tool_calls.as_mut())
                            .and_then(|calls| {
                                calls
                                    .last_mut()
                                    .filter(|c| c.index == index && c.id.is_none())
                            });
                    match joined {
                        Some(call) => call.function.arguments.push_str(&fragment),
                        None => out.push(call_delta(ToolCallDelta {
                            index,
                            id: None,
                            kind: None,
                            function: FunctionCallDelta {
                                name: None,
                                arguments: fragment,
                            },
                        })),
                    }
                }
            }
        }
        out
    }
}

fn call_delta(call: ToolCallDelta) -> ChatDelta {
    ChatDelta {
        tool_calls: Some(vec![call]),
        ..ChatDelta::default()
    }
}
