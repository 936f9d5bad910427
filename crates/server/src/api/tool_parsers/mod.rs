//! Finding tool calls in generated text, as it streams.
//!
//! A parser takes the text of one choice piece by piece and gives [`ToolEvent`]s:
//! content, the start of a call (its name), and fragments of a call's arguments. The
//! same events make the whole reply (non-streaming) and the stream's deltas, so both
//! always agree, however the text was split.
//!
//! Families (`--tool-call-parser`, else chosen from the chat template):
//! - `hermes`: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Hermes, Qwen
//!   2.5 and Qwen 3); also the form the server asks for when a template does not know
//!   tools.
//! - `llama3_json`: Llama 3.x's `{"name": ..., "parameters": ...}` as the whole reply,
//!   calls separated by `;`.
//! - `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]`, and the form of
//!   Mistral's v11+ templates, `[TOOL_CALLS]name[ARGS]{...}` once per call.
//! - `glm45`: GLM-4.5's `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>
//!   </tool_call>`, values typed by the tools' schemas.
//! - `qwen3_coder`: Qwen3-Coder's `<tool_call><function=name><parameter=k>v</parameter>
//!   </function></tool_call>`, values typed likewise.
//! - `minimax_m2`: MiniMax-M2's `<minimax:tool_call><invoke name="f"><parameter
//!   name="k">v</parameter></invoke></minimax:tool_call>`, values typed likewise.
//!
//! Forced calls (`tool_choice` `required` or named) are read by [`forced`]'s parsers,
//! from the JSON the grammar made.

mod call_array;
mod call_object;
pub mod forced;
pub mod glm45;
mod hermes;
mod llama3;
mod markers;
pub mod minimax_m2;
mod mistral;
pub mod param_types;
pub mod qwen3_coder;
mod tagged_args;
mod value_scan;

use std::fmt;
use std::str::FromStr;

pub use call_object::{CallObject, CallProgress};

/// What a piece of generated text turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Plain reply text.
    Content(String),
    /// Call number `index` (from 0 in the reply) of function `name` begins.
    CallStart { index: usize, name: String },
    /// More of call `index`'s arguments (JSON text).
    CallArguments { index: usize, fragment: String },
}

/// A streaming parser of one choice's text.
pub trait ToolCallParser: Send {
    /// Reads more text; gives what can be said about it so far.
    fn push(&mut self, text: &str) -> Vec<ToolEvent>;
    /// The text ended: gives whatever was held back.
    fn finish(&mut self) -> Vec<ToolEvent>;
}

/// A model family's way of writing tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParserKind {
    Hermes,
    Llama3Json,
    Mistral,
    Glm45,
    Qwen3Coder,
    MiniMaxM2,
}

impl ToolParserKind {
    pub const NAMES: [&'static str; 6] = [
        "hermes",
        "llama3_json",
        "mistral",
        "glm45",
        "qwen3_coder",
        "minimax_m2",
    ];

    /// The family a chat template writes tool calls in. Templates that show no form of
    /// their own get the Hermes form, which the server then asks for in the prompt.
    pub fn from_template(source: &str) -> Self {
        if source.contains("[TOOL_CALLS]") {
            ToolParserKind::Mistral
        } else if source.contains("<minimax:tool_call>") {
            ToolParserKind::MiniMaxM2
        } else if source.contains("<arg_key>") {
            ToolParserKind::Glm45
        } else if source.contains("<function=") {
            ToolParserKind::Qwen3Coder
        } else if source.contains("<tool_call>") {
            ToolParserKind::Hermes
        } else if source.contains("<|python_tag|>")
            || (source.contains("<|start_header_id|>") && source.contains("parameters"))
        {
            ToolParserKind::Llama3Json
        } else {
            ToolParserKind::Hermes
        }
    }

    /// Special tokens of the family's form that the parser must see in the text (the
    /// detokenizer otherwise drops special tokens).
    pub fn marker_tokens(self) -> &'static [&'static str] {
        match self {
            ToolParserKind::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            ToolParserKind::Glm45 => &glm45::MARKERS,
            ToolParserKind::Qwen3Coder => &[],
            ToolParserKind::MiniMaxM2 => &minimax_m2::MARKERS,
            ToolParserKind::Hermes | ToolParserKind::Llama3Json => &[],
        }
    }

    /// A fresh parser for one choice (GLM-4.5's, Qwen3-Coder's and MiniMax-M2's, without the tools'
    /// schemas, read every value that is JSON as JSON: [`ToolOutput`](crate::api::tool_prompt::ToolOutput)
    /// gives it the schemas).
    pub fn parser(self) -> Box<dyn ToolCallParser> {
        match self {
            ToolParserKind::Glm45 => Box::new(glm45::Glm45Parser::new(Default::default())),
            ToolParserKind::Qwen3Coder => {
                Box::new(qwen3_coder::Qwen3CoderParser::new(Default::default()))
            }
            ToolParserKind::MiniMaxM2 => {
                Box::new(minimax_m2::MiniMaxM2Parser::new(Default::default()))
            }
            ToolParserKind::Hermes => Box::new(hermes::HermesParser::default()),
            ToolParserKind::Llama3Json => Box::new(llama3::Llama3JsonParser::default()),
            ToolParserKind::Mistral => Box::new(mistral::MistralParser::default()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolParserKind::Hermes => "hermes",
            ToolParserKind::Llama3Json => "llama3_json",
            ToolParserKind::Mistral => "mistral",
            ToolParserKind::Glm45 => "glm45",
            ToolParserKind::Qwen3Coder => "qwen3_coder",
            ToolParserKind::MiniMaxM2 => "minimax_m2",
        }
    }
}

impl fmt::Display for ToolParserKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ToolParserKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hermes" => Ok(ToolParserKind::Hermes),
            "llama3_json" => Ok(ToolParserKind::Llama3Json),
            "mistral" => Ok(ToolParserKind::Mistral),
            "glm45" => Ok(ToolParserKind::Glm45),
            "qwen3_coder" => Ok(ToolParserKind::Qwen3Coder),
            "minimax_m2" => Ok(ToolParserKind::MiniMaxM2),
            other => Err(format!(
                "unknown tool call parser `{other}`: use one of {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

/// A finished reply: its content and its calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedReply {
    /// `None` when the reply is only calls (and blank text).
    pub content: Option<String>,
    /// `(name, arguments)` of each call, in order.
    pub calls: Vec<(String, String)>,
}

impl ParsedReply {
    /// Adds `events` to the reply.
    pub fn apply(&mut self, events: impl IntoIterator<Item = ToolEvent>) {
        for event in events {
            match event {
                ToolEvent::Content(text) => {
                    self.content.get_or_insert_with(String::new).push_str(&text)
                }
                ToolEvent::CallStart { name, .. } => self.calls.push((name, String::new())),
                ToolEvent::CallArguments { index, fragment } => {
                    if let Some(call) = self.calls.get_mut(index) {
                        call.1.push_str(&fragment);
                    }
                }
            }
        }
    }

    /// The whole of `text` read by `parser`.
    pub fn parse(mut parser: Box<dyn ToolCallParser>, text: &str) -> Self {
        let mut reply = ParsedReply::default();
        reply.apply(parser.push(text));
        reply.apply(parser.finish());
        if !reply.calls.is_empty()
            && reply
                .content
                .as_deref()
                .is_some_and(|c| c.trim().is_empty())
        {
            reply.content = None;
        }
        reply
    }
}

#[cfg(test)]
mod marker_tokens_tests;
#[cfg(test)]
mod split_tests;
