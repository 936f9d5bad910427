//! SmolLM2's ChatML template, from the GGUF and from the saved HF folder, against
//! transformers' `apply_chat_template` (tests/fixtures/tokenizer/smollm2_chat.json).

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use common::{cases, ids_of, load_fixture, smollm2_both};
use tessera_tokenizer::{ChatMessage, ChatRenderRequest, ContentFormat, MessageContent};

fn request_of(case: &serde_json::Value) -> ChatRenderRequest {
    ChatRenderRequest {
        messages: serde_json::from_value(case["messages"].clone()).unwrap(),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
        tools: None,
        kwargs: Default::default(),
    }
}

#[test]
fn rendered_text_and_ids_equal_transformers() {
    let fixture = load_fixture("smollm2_chat.json");
    for (path, tokenizer) in smollm2_both() {
        let template = tokenizer.chat_template().unwrap();
        assert_eq!(template.content_format(), ContentFormat::String, "[{path}]");
        for case in cases(&fixture) {
            let name = case["name"].as_str().unwrap();
            let rendered = template.render(&request_of(case)).unwrap();
            assert_eq!(
                rendered,
                case["rendered"].as_str().unwrap(),
                "[{path}] {name}"
            );
            let ids = tokenizer.encode(&rendered, false).unwrap();
            // transformers and llama.cpp agree on every chat prompt here.
            assert_eq!(case["ids"], case["ids_llamacpp"], "{name}");
            assert_eq!(ids, ids_of(&case["ids"]), "[{path}] {name}");
        }
    }
}

#[test]
fn text_parts_render_like_strings() {
    let fixture = load_fixture("smollm2_chat.json");
    let case = &cases(&fixture)[0];
    let mut request = request_of(case);
    let text = match &request.messages[0].content {
        Some(MessageContent::Text(text)) => text.clone(),
        other => panic!("unexpected content {other:?}"),
    };
    let (first, second) = text.split_once("? ").unwrap();
    request.messages[0].content = Some(MessageContent::Parts(vec![
        serde_json::json!({"type": "text", "text": format!("{first}?")}),
        serde_json::json!({"type": "text", "text": second}),
    ]));
    for (path, tokenizer) in smollm2_both() {
        let rendered = tokenizer.chat_template().unwrap().render(&request).unwrap();
        // Parts are joined with a newline where the original had a space.
        let expected = case["rendered"]
            .as_str()
            .unwrap()
            .replace("France? Answer", "France?\nAnswer");
        assert_eq!(rendered, expected, "[{path}]");
    }
}

#[test]
fn kwargs_reach_the_template_and_override_special_tokens() {
    let (_, tokenizer) = smollm2_both().remove(0);
    let config = tessera_tokenizer::ChatTemplateConfig {
        fuel: 10_000,
        ..Default::default()
    };
    let template = tessera_tokenizer::ChatTemplate::new(
        "{{ bos_token }}|{{ eos_token }}|{{ flavour }}|{{ messages | length }}|{{ messages[0].content | tojson }}|{{ strftime_now('%Y') | length }}",
        tokenizer.special_token_strings().clone(),
        &config,
    )
    .unwrap();
    let mut request = ChatRenderRequest {
        messages: vec![ChatMessage::new("user", "<b>\"é\"</b>")],
        ..Default::default()
    };
    request.kwargs.insert("flavour".into(), "vanilla".into());
    assert_eq!(
        template.render(&request).unwrap(),
        r#"<|im_start|>|<|im_end|>|vanilla|1|"<b>\"é\"</b>"|4"#
    );
    request.kwargs.insert("eos_token".into(), "</s>".into());
    assert!(template
        .render(&request)
        .unwrap()
        .starts_with("<|im_start|>|</s>|"));
}
