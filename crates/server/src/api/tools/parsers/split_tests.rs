//! Every parser on recorded outputs of its family: the reply read whole, and read in two
//! pieces cut at every character boundary (and in pieces of every single character),
//! gives the same content and calls.

#![allow(clippy::unwrap_used)]

use crate::api::tools::parsers::forced::{ForcedArrayParser, ForcedNamedParser};
use crate::api::tools::parsers::{ParsedReply, ToolCallParser, ToolEvent, ToolParserKind};

type Make = fn() -> Box<dyn ToolCallParser>;

fn reply_of(parser: &mut dyn ToolCallParser, pieces: &[&str]) -> ParsedReply {
    let mut reply = ParsedReply::default();
    let mut started = 0;
    for piece in pieces {
        let events = parser.push(piece);
        for e in &events {
            match e {
                ToolEvent::CallStart { index, .. } => {
                    assert_eq!(*index, started, "calls start in order");
                    started += 1;
                }
                ToolEvent::CallArguments { index, .. } => {
                    assert!(*index < started, "arguments after their call's start")
                }
                ToolEvent::Content(t) => assert!(!t.is_empty(), "empty content event"),
            }
        }
        reply.apply(events);
    }
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

fn check(make: Make, text: &str, content: Option<&str>, calls: &[(&str, &str)]) {
    let expected = ParsedReply {
        content: content.map(str::to_string),
        calls: calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect(),
    };
    assert_eq!(
        ParsedReply::parse(make(), text),
        expected,
        "whole: {text:?}"
    );
    for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
        let got = reply_of(make().as_mut(), &[&text[..cut], &text[cut..]]);
        assert_eq!(got, expected, "cut at {cut}: {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(
        reply_of(make().as_mut(), &pieces),
        expected,
        "char by char: {text:?}"
    );
}

fn hermes() -> Box<dyn ToolCallParser> {
    ToolParserKind::Hermes.parser()
}
fn llama3() -> Box<dyn ToolCallParser> {
    ToolParserKind::Llama3Json.parser()
}
fn mistral() -> Box<dyn ToolCallParser> {
    ToolParserKind::Mistral.parser()
}

#[test]
fn hermes_recorded_outputs() {
    // Qwen 2.5 calling one tool.
    check(
        hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n</tool_call>",
        None,
        &[("get_weather", r#"{"city": "Paris", "unit": "°C"}"#)],
    );
    // Text before two calls.
    check(
        hermes,
        "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"</tool_call>\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>",
        Some("Let me check both."),
        &[("a", r#"{"x": "</tool_call>"}"#), ("b", "{}")],
    );
    // No call at all, with text that looks like the start of a tag.
    check(
        hermes,
        "Use <tool> tags or a < b. \n",
        Some("Use <tool> tags or a < b. \n"),
        &[],
    );
    // A tag that opens no JSON object is text.
    check(
        hermes,
        "see <tool_call>none here",
        Some("see <tool_call>none here"),
        &[],
    );
    // Cut by max_tokens inside the arguments: the call keeps what was written.
    check(
        hermes,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"ab",
        None,
        &[("f", "{\"q\": \"ab")],
    );
}

#[test]
fn llama3_recorded_outputs() {
    check(
        llama3,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\"}}",
        None,
        &[("get_weather", r#"{"city": "San Francisco"}"#)],
    );
    check(
        llama3,
        " {\"name\": \"a\", \"parameters\": {\"n\": 1}}; {\"name\": \"b\", \"parameters\": {\"s\": \"}\"}}",
        None,
        &[("a", r#"{"n": 1}"#), ("b", r#"{"s": "}"}"#)],
    );
    check(
        llama3,
        "The weather is sunny {\"name\": \"x\"}",
        Some("The weather is sunny {\"name\": \"x\"}"),
        &[],
    );
    check(llama3, "{\"answer\": 42}", Some("{\"answer\": 42}"), &[]);
}

#[test]
fn mistral_recorded_outputs() {
    check(
        mistral,
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}, {\"name\": \"now\", \"arguments\": {}}]",
        None,
        &[("get_weather", r#"{"city": "Lyon"}"#), ("now", "{}")],
    );
    // The marker is a special token the detokenizer drops.
    check(
        mistral,
        " [{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}]",
        None,
        &[("f", r#"{"a": [1, 2]}"#)],
    );
    check(
        mistral,
        "[1] is a citation, [TOOL_CALLS is not a marker",
        Some("[1] is a citation, [TOOL_CALLS is not a marker"),
        &[],
    );
    check(
        mistral,
        "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",
        Some("Sure."),
        &[("f", "{}")],
    );
}

#[test]
fn mistral_v11_recorded_outputs() {
    // Mistral Small 3.2 calling two tools: the marker before each call.
    check(
        mistral,
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lyon\", \"unit\": \"°C\"}[TOOL_CALLS]now[ARGS]{}",
        None,
        &[("get_weather", r#"{"city": "Lyon", "unit": "°C"}"#), ("now", "{}")],
    );
    // Text first; brackets and a marker inside the arguments' strings.
    check(
        mistral,
        "Let me look. [TOOL_CALLS]web.search[ARGS]{\"q\": \"a } [TOOL_CALLS] b\", \"n\": [1, {\"k\": 2}]}",
        Some("Let me look."),
        &[("web.search", r#"{"q": "a } [TOOL_CALLS] b", "n": [1, {"k": 2}]}"#)],
    );
    // The v13 form: a call id between the name and the arguments.
    check(
        mistral,
        "[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{\"zone\": \"UTC\"}[TOOL_CALLS]get-date[CALL_ID]Z9y8X7w6v[ARGS]{}",
        None,
        &[("get_time", r#"{"zone": "UTC"}"#), ("get-date", "{}")],
    );
    // Cut by max_tokens inside the arguments: the call keeps what was written.
    check(
        mistral,
        "[TOOL_CALLS]f[ARGS]{\"q\": \"ab",
        None,
        &[("f", "{\"q\": \"ab")],
    );
    // A marker followed by no call: the text is content, the marker dropped.
    check(mistral, "[TOOL_CALLS]not a call", Some("not a call"), &[]);
    check(mistral, "[TOOL_CALLS]f[ARGS]none", Some("fnone"), &[]);
}

#[test]
fn forced_outputs() {
    check(
        || Box::new(ForcedArrayParser::default()),
        "[{\"name\": \"a\", \"arguments\": {\"x\": \"[{\\\"\"}}, {\"name\": \"b\", \"arguments\": {}}]",
        None,
        &[("a", r#"{"x": "[{\""}"#), ("b", "{}")],
    );
    check(
        || Box::new(ForcedNamedParser::new("f".into())),
        "{\"city\": \"Paris\"}",
        None,
        &[("f", r#"{"city": "Paris"}"#)],
    );
}

#[test]
fn parser_follows_the_template() {
    assert_eq!(
        ToolParserKind::from_template("{{ '<tool_call>' }}"),
        ToolParserKind::Hermes
    );
    assert_eq!(
        ToolParserKind::from_template("[TOOL_CALLS] {{ x }}"),
        ToolParserKind::Mistral
    );
    assert_eq!(
        ToolParserKind::from_template("<|start_header_id|>ipython {{ '<|python_tag|>' }}"),
        ToolParserKind::Llama3Json
    );
    assert_eq!(
        ToolParserKind::from_template("<|im_start|>"),
        ToolParserKind::Hermes
    );
    // GLM-4.5's template shows both its call tag and its argument tags.
    assert_eq!(
        ToolParserKind::from_template("<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>"),
        ToolParserKind::Glm45
    );
    assert_eq!("glm45".parse::<ToolParserKind>(), Ok(ToolParserKind::Glm45));
    // Qwen3-Coder's shows its function tags inside <tool_call>.
    assert_eq!(
        ToolParserKind::from_template("<tool_call>\n<function=example_function_name>"),
        ToolParserKind::Qwen3Coder
    );
    assert_eq!(
        "mistral".parse::<ToolParserKind>(),
        Ok(ToolParserKind::Mistral)
    );
    // MiniMax-M2's names its block, which no other form's tag matches.
    assert_eq!(
        ToolParserKind::from_template(
            "<minimax:tool_call>\n<invoke name=\"tool-name-1\">\n<parameter name=\"k\">"
        ),
        ToolParserKind::MiniMaxM2
    );
    assert_eq!(
        "minimax_m2".parse::<ToolParserKind>(),
        Ok(ToolParserKind::MiniMaxM2)
    );
    assert!("nope".parse::<ToolParserKind>().is_err());
}

/// `get_weather(city: string, days: integer)` and `set(zip: string, opts: object)`: their
/// string parameters stay strings whatever their text looks like.
fn weather_tools() -> crate::api::tools::parsers::param_types::ParamTypes {
    use crate::api::tools::parsers::param_types::ParamTypes;
    use crate::api::tools::request::{FunctionTool, ToolChoice, ToolRequest};
    let tool = |name: &str, parameters: serde_json::Value| FunctionTool {
        name: name.into(),
        description: None,
        parameters,
    };
    let tools = ToolRequest {
        tools: vec![
            tool(
                "get_weather",
                serde_json::json!({"type": "object", "properties": {
                    "city": {"type": "string"}, "days": {"type": "integer"}}}),
            ),
            tool(
                "set",
                serde_json::json!({"type": "object", "properties": {
                    "zip": {"type": ["string", "null"]}, "opts": {"type": "object"},
                    "on": {"type": "boolean"}}}),
            ),
        ],
        choice: ToolChoice::Auto,
        parallel: true,
    };
    ParamTypes::of(&tools)
}

fn glm45() -> Box<dyn ToolCallParser> {
    Box::new(crate::api::tools::parsers::glm45::Glm45Parser::new(
        weather_tools(),
    ))
}

fn qwen3_coder() -> Box<dyn ToolCallParser> {
    Box::new(crate::api::tools::parsers::qwen3_coder::Qwen3CoderParser::new(weather_tools()))
}

#[test]
fn qwen3_coder_recorded_outputs() {
    // One call as Qwen3-Coder's template writes calls.
    check(
        qwen3_coder,
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        None,
        &[("get_weather", r#"{"city": "Paris", "days": 3}"#)],
    );
    // Text, then two calls: a string that looks like a number, an object as JSON, a
    // boolean as Python writes it, a multi-line string; an unknown tool's text.
    check(
        qwen3_coder,
        "I'll do both.\n<tool_call>\n<function=set>\n<parameter=zip>\n75001\n</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n<parameter=on>\nTrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=note>\n<parameter=text>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>",
        Some("I'll do both."),
        &[
            ("set", r#"{"zip": "75001", "opts": {"a":[1]}, "on": true}"#),
            ("note", r#"{"text": "line 1\nline 2"}"#),
        ],
    );
    // No parameters; a block that opens no function is text.
    check(
        qwen3_coder,
        "<tool_call>\n<function=now>\n</function>\n</tool_call>",
        None,
        &[("now", "{}")],
    );
    check(
        qwen3_coder,
        "Use <tool_call> then <function name>",
        Some("Use <tool_call> then <function name>"),
        &[],
    );
    // Cut by max_tokens inside a value: the call keeps its complete arguments.
    check(
        qwen3_coder,
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n<parameter=city>\nLy",
        None,
        &[("get_weather", r#"{"days": 2}"#)],
    );
}

#[test]
fn glm45_recorded_outputs() {
    // GLM-4.6 calling one tool, as its template writes calls, after its thinking.
    check(
        glm45,
        "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        None,
        &[("get_weather", r#"{"city": "Paris", "days": 3}"#)],
    );
    // Text, then two calls; a string that looks like a number stays a string, JSON
    // values of other types are read as JSON, text that is not JSON is a string.
    check(
        glm45,
        "Both, then.\n<tool_call>set\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"a\": [1, true]}</arg_value>\n</tool_call>\n<tool_call>unknown\n<arg_key>x</arg_key>\n<arg_value>not json</arg_value>\n<arg_key>y</arg_key>\n<arg_value>null</arg_value>\n</tool_call>",
        Some("Both, then."),
        &[
            ("set", r#"{"zip": "75001", "opts": {"a":[1,true]}}"#),
            ("unknown", r#"{"x": "not json", "y": null}"#),
        ],
    );
    // A call with no arguments; a value holding the closing tag of a key.
    check(
        glm45,
        "<tool_call>now\n</tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>a</arg_key>b</arg_value></tool_call>",
        None,
        &[("now", "{}"), ("get_weather", r#"{"city": "a</arg_key>b"}"#)],
    );
    // Tags that open no call are text.
    check(
        glm45,
        "Use <tool_call> like <tool_call><arg_key>",
        Some("Use <tool_call> like <tool_call><arg_key>"),
        &[],
    );
    // Cut by max_tokens inside a value: the call keeps its complete arguments.
    check(
        glm45,
        "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>city</arg_key>\n<arg_value>Ly",
        None,
        &[("get_weather", r#"{"days": 2}"#)],
    );
}

fn minimax_m2() -> Box<dyn ToolCallParser> {
    Box::new(crate::api::tools::parsers::minimax_m2::MiniMaxM2Parser::new(weather_tools()))
}

#[test]
fn minimax_m2_recorded_outputs() {
    // One call as MiniMax-M2's guide shows calls, after the thinking the reply keeps.
    check(
        minimax_m2,
        "<think>\nThe user wants Paris.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>",
        Some("<think>\nThe user wants Paris.\n</think>"),
        &[("get_weather", r#"{"city": "Paris", "days": 3}"#)],
    );
    // Two calls in one block: a string that looks like a number, an object and a list as
    // JSON, a boolean; an unknown tool's text; unquoted names; text after the block.
    check(
        minimax_m2,
        "Both.\n<minimax:tool_call>\n<invoke name=\"set\">\n<parameter name=\"zip\">75001</parameter>\n<parameter name=\"opts\">{\"a\": [1]}</parameter>\n<parameter name=\"on\">true</parameter>\n</invoke>\n<invoke name=note>\n<parameter name=text>\nline 1\nline 2\n</parameter>\n<parameter name=\"tags\">[\"x\", \"y\"]</parameter>\n</invoke>\n</minimax:tool_call>\nDone.",
        Some("Both.\nDone."),
        &[
            ("set", r#"{"zip": "75001", "opts": {"a":[1]}, "on": true}"#),
            ("note", r#"{"text": "line 1\nline 2", "tags": ["x","y"]}"#),
        ],
    );
    // No parameters; a block that opens no call is text.
    check(
        minimax_m2,
        "<minimax:tool_call><invoke name=\"now\"></invoke></minimax:tool_call>",
        None,
        &[("now", "{}")],
    );
    check(
        minimax_m2,
        "Write <minimax:tool_call> then <invoke",
        Some("Write <minimax:tool_call> then <invoke"),
        &[],
    );
    // Cut by max_tokens inside a value: the call keeps its complete arguments.
    check(
        minimax_m2,
        "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"days\">2</parameter>\n<parameter name=\"city\">Ly",
        None,
        &[("get_weather", r#"{"days": 2}"#)],
    );
}
