//! Tools and chat templates: which form the reply's calls take, and a conversation
//! shaped for templates that know nothing of tools.
//!
//! A template that refers to `tools` gets them as transformers passes them, and the
//! parser of its family reads the reply. A template that does not (SmolLM2's plain
//! ChatML, for one) would drop them silently, so the tools are described in the system
//! message in the Hermes form, earlier calls are written into the assistant turns in
//! that form, and tool results become `<tool_response>` user turns: any chat model can
//! then be offered tools, and the Hermes parser reads its calls.

use serde_json::{json, Map, Value};
use tessera_tokenizer::{ChatMessage, MessageContent, Tokenizer};

use crate::api::tools::parsers::forced::{ForcedArrayParser, ForcedNamedParser};
use crate::api::tools::parsers::glm45::Glm45Parser;
use crate::api::tools::parsers::minimax_m2::MiniMaxM2Parser;
use crate::api::tools::parsers::param_types::ParamTypes;
use crate::api::tools::parsers::qwen3_coder::Qwen3CoderParser;
use crate::api::tools::parsers::{ToolCallParser, ToolParserKind};
use crate::api::tools::request::{ForcedCalls, ToolChoice, ToolRequest};

/// How the calls of a reply are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutput {
    /// The grammar forced them (`required` or a named function).
    Forced(ForcedCalls),
    /// The model wrote them in its family's form (`auto`).
    Parsed(ToolParserKind),
    /// In a form whose argument values are bare text (GLM-4.5's, Qwen3-Coder's,
    /// MiniMax-M2's): its
    /// parser, given the tools' parameter types.
    Typed(ToolParserKind, ParamTypes),
}

impl ToolOutput {
    /// A fresh reader for one choice.
    pub fn parser(&self) -> Box<dyn ToolCallParser> {
        match self {
            ToolOutput::Forced(ForcedCalls::Array) => Box::new(ForcedArrayParser::default()),
            ToolOutput::Forced(ForcedCalls::Named(name)) => {
                Box::new(ForcedNamedParser::new(name.clone()))
            }
            ToolOutput::Parsed(kind) => kind.parser(),
            ToolOutput::Typed(ToolParserKind::Qwen3Coder, types) => {
                Box::new(Qwen3CoderParser::new(types.clone()))
            }
            ToolOutput::Typed(ToolParserKind::MiniMaxM2, types) => {
                Box::new(MiniMaxM2Parser::new(types.clone()))
            }
            ToolOutput::Typed(_, types) => Box::new(Glm45Parser::new(types.clone())),
        }
    }

    /// The ids of the special tokens the parser reads as markers, for the detokenizer
    /// to keep in the text.
    pub fn marker_ids(&self, tokenizer: &Tokenizer) -> Vec<u32> {
        let kind = match self {
            ToolOutput::Parsed(kind) | ToolOutput::Typed(kind, _) => *kind,
            ToolOutput::Forced(_) => return Vec::new(),
        };
        special_ids(tokenizer, kind.marker_tokens())
    }
}

/// The ids of those of `tokens` that are special tokens of the vocabulary (which a
/// detokenizer skipping special tokens must keep for a parser to read them).
pub fn special_ids(tokenizer: &Tokenizer, tokens: &[&str]) -> Vec<u32> {
    tokens
        .iter()
        .filter_map(|t| tokenizer.token_to_id(t))
        .filter(|&id| tokenizer.is_special(id))
        .collect()
}

/// The messages and tools to render with the template `source`, and how the reply's
/// calls are read (`None`: the reply is plain text).
pub fn adapt_to_template(
    mut messages: Vec<ChatMessage>,
    tools: Option<&ToolRequest>,
    source: &str,
    parser_flag: Option<ToolParserKind>,
) -> (Vec<ChatMessage>, Option<Vec<Value>>, Option<ToolOutput>) {
    let knows_tools = source.contains("tools");
    if !source.contains("tool_calls") {
        for m in &mut messages {
            write_calls_as_text(m);
        }
    }
    if !(source.contains("'tool'") || source.contains("\"tool\"")) {
        for m in &mut messages {
            write_result_as_user_turn(m);
        }
    }
    if ToolParserKind::from_template(source) == ToolParserKind::Mistral {
        for m in &mut messages {
            give_mistral_call_ids(m);
        }
    }
    let Some(tools) = tools else {
        return (messages, None, None);
    };
    let output = match (&tools.choice, tools.forced()) {
        (_, Some(forced)) => Some(ToolOutput::Forced(forced)),
        (ToolChoice::None, None) => None,
        (_, None) => Some(
            match parser_flag.unwrap_or_else(|| ToolParserKind::from_template(source)) {
                kind @ (ToolParserKind::Glm45
                | ToolParserKind::Qwen3Coder
                | ToolParserKind::MiniMaxM2) => ToolOutput::Typed(kind, ParamTypes::of(tools)),
                kind => ToolOutput::Parsed(kind),
            },
        ),
    };
    if knows_tools {
        return (messages, Some(tools.template_tools()), output);
    }
    if tools.choice != ToolChoice::None {
        add_to_system(&mut messages, &describe_tools(&tools.template_tools()));
    }
    (messages, None, output)
}

/// The Hermes-form description of `tools` for the system message.
fn describe_tools(tools: &[Value]) -> String {
    let mut text = String::from(
        "You may call one or more functions to assist with the user query. The function \
         signatures are within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&tool.to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

/// Appends `text` to a leading system message, or puts one first.
fn add_to_system(messages: &mut Vec<ChatMessage>, text: &str) {
    if let Some(first) = messages.first_mut().filter(|m| m.role == "system") {
        if let Some(MessageContent::Text(existing)) = &mut first.content {
            existing.push_str("\n\n");
            existing.push_str(text);
            return;
        }
    }
    messages.insert(0, ChatMessage::new("system", text));
}

/// An assistant turn's calls as `<tool_call>` text after its content.
fn write_calls_as_text(m: &mut ChatMessage) {
    let Some(Value::Array(calls)) = m.extra.remove("tool_calls") else {
        return;
    };
    let mut text = match &m.content {
        Some(MessageContent::Text(t)) => t.clone(),
        _ => String::new(),
    };
    for call in calls {
        let function = call.get("function").cloned().unwrap_or(Value::Null);
        let object = json!({
            "name": function.get("name").cloned().unwrap_or(Value::Null),
            "arguments": function.get("arguments").cloned().unwrap_or(Value::Object(Map::new())),
        });
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("<tool_call>\n{object}\n</tool_call>"));
    }
    m.content = Some(MessageContent::Text(text));
}

/// A tool result as a user turn holding a `<tool_response>`.
fn write_result_as_user_turn(m: &mut ChatMessage) {
    if m.role != "tool" {
        return;
    }
    m.extra.remove("tool_call_id");
    let result = match &m.content {
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        None => String::new(),
    };
    m.role = "user".into();
    m.content = Some(MessageContent::Text(format!(
        "<tool_response>\n{result}\n</tool_response>"
    )));
}

/// Mistral's templates refuse a call id that is not nine characters (they raise "Tool
/// call IDs should be alphanumeric strings with length 9!"), while OpenAI clients send
/// back the ids they were given (`call_…`). Each other id becomes nine alphanumeric
/// characters derived from it, the same in the assistant's call and in the tool result
/// that answers it.
fn give_mistral_call_ids(m: &mut ChatMessage) {
    if let Some(Value::Array(calls)) = m.extra.get_mut("tool_calls") {
        for call in calls {
            if let Some(id) = call.get_mut("id") {
                mistral_call_id(id);
            }
        }
    }
    if let Some(id) = m.extra.get_mut("tool_call_id") {
        mistral_call_id(id);
    }
}

fn mistral_call_id(id: &mut Value) {
    let Value::String(s) = id else {
        return;
    };
    if s.len() == 9 && s.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return;
    }
    // Nine base-62 digits of the id's hash (62^9 < 2^64). `DefaultHasher::new()` has
    // fixed keys: the call and its result, rendered in one request, get the same id.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(s.as_str(), &mut hasher);
    let mut hash = std::hash::Hasher::finish(&hasher);
    const DIGITS: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let short: String = (0..9)
        .map(|_| {
            let d = DIGITS[(hash % 62) as usize] as char;
            hash /= 62;
            d
        })
        .collect();
    *id = Value::String(short);
}
