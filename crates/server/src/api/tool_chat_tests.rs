//! Tool conversations as OpenAI clients send them, rendered through Qwen3's chat
//! template, against what transformers renders (tests/fixtures/tokenizer/tool_chat.json,
//! made by make_tool_chat_fixtures.py). The Qwen3 tokenizer is fetched into the cache by
//! `scripts/make-token-fixtures fetch`; without it this test skips, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::Value;
use tessera_tokenizer::{ChatRenderRequest, Tokenizer};

use crate::api::chat_request::{template_messages, ChatMessageIn};
use crate::api::tool_parsers::ToolParserKind;
use crate::api::tool_prompt::{adapt_to_template, ToolOutput};
use crate::api::tools::ToolRequest;

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("tessera");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/tessera")
}

#[test]
fn openai_tool_conversations_render_as_transformers_renders_them() {
    let dir = cache_dir().join("tokenizers/qwen3");
    if !dir.join("tokenizer.json").exists() {
        eprintln!(
            "skipped: no Qwen3 tokenizer in {} (scripts/make-token-fixtures fetch)",
            dir.display()
        );
        return;
    }
    let tokenizer = Tokenizer::from_hf_dir(&dir).unwrap();
    let template = tokenizer.chat_template().unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer/tool_chat.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let sent: Vec<ChatMessageIn> = serde_json::from_value(case["messages"].clone()).unwrap();
        let messages = template_messages(&sent).unwrap();
        let tools = ToolRequest::parse(Some(&case["tools"]), None, None).unwrap();
        let (messages, tools, output) =
            adapt_to_template(messages, tools.as_ref(), template.source(), None);
        assert_eq!(
            output,
            Some(ToolOutput::Parsed(ToolParserKind::Hermes)),
            "{name}"
        );
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
