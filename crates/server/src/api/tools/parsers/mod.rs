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

/// One family's form of tool calls: all the server knows of it, in one row.
pub struct ToolParserSpec {
    pub kind: ToolParserKind,
    /// Its `--tool-call-parser` name.
    pub name: &'static str,
    /// Whether a chat template writes calls in this form (rows are tried in order).
    pub in_template: fn(&str) -> bool,
    /// Special tokens of the form that the parser must see in the text (the
    /// detokenizer otherwise drops special tokens).
    pub markers: &'static [&'static str],
    /// A fresh parser for one choice (GLM-4.5's, Qwen3-Coder's and MiniMax-M2's,
    /// without the tools' schemas, read every value that is JSON as JSON:
    /// [`ToolOutput`](crate::api::tools::prompt::ToolOutput) gives them the schemas).
    pub parser: fn() -> Box<dyn ToolCallParser>,
}

/// The form the server asks for when a template shows none of its own.
const HERMES: ToolParserSpec = ToolParserSpec {
    kind: ToolParserKind::Hermes,
    name: "hermes",
    in_template: |t| t.contains("<tool_call>"),
    markers: &[],
    parser: || Box::new(hermes::HermesParser::default()),
};

/// Every form of tool calls, in the order a chat template is matched against them: the
/// forms whose markers another form's contain come first. A template that shows none
/// gets the Hermes form, which the server then asks for in the prompt.
pub const TOOL_PARSERS: &[ToolParserSpec] = &[
    ToolParserSpec {
        kind: ToolParserKind::Mistral,
        name: "mistral",
        in_template: |t| t.contains("[TOOL_CALLS]"),
        markers: &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
        parser: || Box::new(mistral::MistralParser::default()),
    },
    ToolParserSpec {
        kind: ToolParserKind::MiniMaxM2,
        name: "minimax_m2",
        in_template: |t| t.contains("<minimax:tool_call>"),
        markers: &minimax_m2::MARKERS,
        parser: || Box::new(minimax_m2::MiniMaxM2Parser::new(Default::default())),
    },
    ToolParserSpec {
        kind: ToolParserKind::Glm45,
        name: "glm45",
        in_template: |t| t.contains("<arg_key>"),
        markers: &glm45::MARKERS,
        parser: || Box::new(glm45::Glm45Parser::new(Default::default())),
    },
    ToolParserSpec {
        kind: ToolParserKind::Qwen3Coder,
        name: "qwen3_coder",
        in_template: |t| t.contains("<function="),
        markers: &[],
        parser: || Box::new(qwen3_coder::Qwen3CoderParser::new(Default::default())),
    },
    HERMES,
    ToolParserSpec {
        kind: ToolParserKind::Llama3Json,
        name: "llama3_json",
        in_template: |t| {
            t.contains("<|python_tag|>")
                || (t.contains("<|start_header_id|>") && t.contains("parameters"))
        },
        markers: &[],
        parser: || Box::new(llama3::Llama3JsonParser::default()),
    },
];

impl ToolParserKind {
    /// This family's row of [`TOOL_PARSERS`].
    pub fn spec(self) -> &'static ToolParserSpec {
        // Every kind has a row (`every_kind_has_one_row...`).
        TOOL_PARSERS
            .iter()
            .find(|s| s.kind == self)
            .unwrap_or(&HERMES)
    }

    /// The family a chat template writes tool calls in; Hermes when it shows none.
    pub fn from_template(source: &str) -> Self {
        TOOL_PARSERS
            .iter()
            .find(|s| (s.in_template)(source))
            .map_or(HERMES.kind, |s| s.kind)
    }

    /// Special tokens of the family's form that the parser must see in the text.
    pub fn marker_tokens(self) -> &'static [&'static str] {
        self.spec().markers
    }

    /// A fresh parser for one choice.
    pub fn parser(self) -> Box<dyn ToolCallParser> {
        (self.spec().parser)()
    }

    pub fn name(self) -> &'static str {
        self.spec().name
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
        TOOL_PARSERS
            .iter()
            .find(|p| p.name == s)
            .map(|p| p.kind)
            .ok_or_else(|| {
                let names: Vec<&str> = TOOL_PARSERS.iter().map(|p| p.name).collect();
                format!(
                    "unknown tool call parser `{s}`: use one of {}",
                    names.join(", ")
                )
            })
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
mod table_tests {
    use super::*;

    #[test]
    fn every_kind_has_one_row_and_its_name_parses_back() {
        for kind in [
            ToolParserKind::Hermes,
            ToolParserKind::Llama3Json,
            ToolParserKind::Mistral,
            ToolParserKind::Glm45,
            ToolParserKind::Qwen3Coder,
            ToolParserKind::MiniMaxM2,
        ] {
            assert_eq!(TOOL_PARSERS.iter().filter(|s| s.kind == kind).count(), 1);
            assert_eq!(kind.spec().kind, kind);
            assert_eq!(kind.name().parse::<ToolParserKind>(), Ok(kind));
        }
        assert_eq!(TOOL_PARSERS.len(), 6);
        assert!("nope"
            .parse::<ToolParserKind>()
            .is_err_and(|e| e.contains("hermes")));
    }

    #[test]
    fn templates_find_their_form_and_the_rest_get_hermes() {
        for (template, kind) in [
            ("{{ '[TOOL_CALLS]' }}", ToolParserKind::Mistral),
            ("<minimax:tool_call><invoke", ToolParserKind::MiniMaxM2),
            ("<tool_call>{{ name }}<arg_key>", ToolParserKind::Glm45),
            (
                "<tool_call><function={{ name }}>",
                ToolParserKind::Qwen3Coder,
            ),
            (
                "<tool_call>{{ call | tojson }}</tool_call>",
                ToolParserKind::Hermes,
            ),
            ("<|python_tag|>", ToolParserKind::Llama3Json),
            ("{{ '<|im_start|>' }}", ToolParserKind::Hermes),
        ] {
            assert_eq!(ToolParserKind::from_template(template), kind, "{template}");
        }
    }
}

#[cfg(test)]
mod marker_tokens_tests;
#[cfg(test)]
mod split_tests;
