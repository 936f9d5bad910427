//! Mistral Nemo Instruct's official tokenizer.json (the tekken vocabulary) and its
//! `[INST]` chat template against transformers (tests/fixtures/tokenizer/mistral_nemo_*.json).
//! The tokenizer is fetched into the cache by `scripts/make-token-fixtures fetch`; without
//! it these tests skip.

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use std::sync::Arc;

use common::{load_fixture, mistral_nemo_dir};
use tessera_tokenizer::{ChatRenderRequest, Tokenizer};

fn mistral_nemo() -> Option<Arc<Tokenizer>> {
    let dir = mistral_nemo_dir()?;
    Some(Arc::new(Tokenizer::from_hf_dir(&dir).unwrap()))
}

#[test]
fn mistral_nemo_ids_and_decode_equal_transformers() {
    let Some(tokenizer) = mistral_nemo() else {
        return;
    };
    let fixture = load_fixture("mistral_nemo_tokenize.json");
    assert_eq!(
        tokenizer.vocab_size(),
        fixture["vocab_size"].as_u64().unwrap() as usize
    );
    common::ids_and_decode_equal_transformers(&tokenizer, &fixture);
}

#[test]
fn mistral_nemo_chat_template_equals_transformers() {
    let Some(tokenizer) = mistral_nemo() else {
        return;
    };
    // `</s>` ends a reply; `<s>` starts every chat, written by the template itself.
    let fixture = load_fixture("mistral_nemo_chat.json");
    let id = |field: &str| fixture[field].as_u64().map(|v| v as u32);
    assert_eq!(tokenizer.bos_token_id(), id("bos_token_id"));
    assert!(tokenizer
        .eos_token_ids()
        .contains(&id("eos_token_id").unwrap()));
    common::chats_render_as_transformers(&tokenizer, &fixture);
}

/// The template refuses roles out of turn with its own message, as transformers does.
#[test]
fn mistral_nemo_template_errors_reach_the_caller() {
    let Some(tokenizer) = mistral_nemo() else {
        return;
    };
    let template = tokenizer.chat_template().unwrap();
    let request = ChatRenderRequest {
        messages: serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"}
        ]))
        .unwrap(),
        add_generation_prompt: true,
        tools: None,
        kwargs: Default::default(),
    };
    let err = template.render(&request).unwrap_err().to_string();
    assert!(err.contains("must alternate user/assistant"), "{err}");
}
