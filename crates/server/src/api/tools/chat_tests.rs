//! Tool conversations as OpenAI clients send them, rendered through Qwen3's and Mistral
//! Nemo's chat templates, against what transformers renders
//! (tests/fixtures/tokenizer/tool_chat.json and mistral_nemo_tool_chat.json, made by
//! make_tool_chat_fixtures.py). The tokenizers are fetched into the cache by
//! `scripts/make-token-fixtures fetch`; without them these tests skip, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::Value;
use tessera_tokenizer::{ChatRenderRequest, Tokenizer};

use crate::api::chat::message::ChatMessageIn;
use crate::api::chat::request::template_messages;
use crate::api::tools::parsers::ToolParserKind;
use crate::api::tools::prompt::{adapt_to_template, ToolOutput};
use crate::api::tools::request::ToolRequest;
use crate::test_fixtures::cached_tokenizer_dir;

#[test]
fn openai_tool_conversations_render_as_transformers_renders_them() {
    check("qwen3", "tool_chat.json", ToolParserKind::Hermes);
}

#[test]
fn openai_tool_conversations_render_through_mistral_as_transformers_renders_them() {
    check(
        "mistral_nemo",
        "mistral_nemo_tool_chat.json",
        ToolParserKind::Mistral,
    );
}

/// Each conversation of `fixture` through the cached tokenizer `name`'s template, whose
/// tool calls the `parser` reads back.
fn check(name: &str, fixture: &str, parser: ToolParserKind) {
    let Some(dir) = cached_tokenizer_dir(name) else {
        return;
    };
    let tokenizer = Tokenizer::from_hf_dir(&dir).unwrap();
    let template = tokenizer.chat_template().unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer")
        .join(fixture);
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let sent: Vec<ChatMessageIn> = serde_json::from_value(case["messages"].clone()).unwrap();
        let messages = template_messages(&sent).unwrap();
        let tools = ToolRequest::parse(Some(&case["tools"]), None, None).unwrap();
        let (messages, tools, output) =
            adapt_to_template(messages, tools.as_ref(), template.source(), None);
        assert_eq!(output, Some(ToolOutput::Parsed(parser)), "{name}");
        let rendered = template
            .render(&ChatRenderRequest {
                messages,
                add_generation_prompt: true,
                tools,
                kwargs: Default::default(),
            })
            .unwrap();
        assert_eq!(rendered, case["rendered"].as_str().unwrap(), "{name}");
    }
}

/// Ids as OpenAI clients send them back (`call_…`, not the nine characters Mistral's
/// templates insist on) still render: each becomes nine alphanumeric characters, the same
/// in the call and in its result, and two calls keep two ids.
#[test]
fn openai_call_ids_become_mistral_ids() {
    let Some(dir) = cached_tokenizer_dir("mistral_nemo") else {
        return;
    };
    let tokenizer = Tokenizer::from_hf_dir(&dir).unwrap();
    let template = tokenizer.chat_template().unwrap();
    let sent: Vec<ChatMessageIn> = serde_json::from_value(serde_json::json!([
        {"role": "user", "content": "Weather and time in Lyon?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_8f3a0c2d9e4b4d1f", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}},
            {"id": "call_1b2c3d4e5f6a7b8c", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_8f3a0c2d9e4b4d1f", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1b2c3d4e5f6a7b8c", "content": "12:00"}
    ]))
    .unwrap();
    let (messages, _, _) = adapt_to_template(
        template_messages(&sent).unwrap(),
        None,
        template.source(),
        None,
    );
    let rendered = template
        .render(&ChatRenderRequest {
            messages,
            add_generation_prompt: true,
            tools: None,
            kwargs: Default::default(),
        })
        .unwrap();
    let ids_after = |marker: &str| -> Vec<String> {
        rendered
            .split(marker)
            .skip(1)
            .map(|rest| rest.chars().take_while(|c| *c != '"').collect())
            .collect()
    };
    let calls = ids_after("\"id\": \"");
    let results = ids_after("\"call_id\": \"");
    assert_eq!(calls.len(), 2, "{rendered}");
    assert_eq!(calls, results, "{rendered}");
    assert_ne!(calls[0], calls[1]);
    for id in &calls {
        assert!(
            id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
            "{id}"
        );
    }
}
