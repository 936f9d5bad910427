//! Chat-template rendering of hostile templates and messages: it must end quickly, within
//! its output limit, with the text or a typed error.

use std::time::{Duration, Instant};

use tessera_tokenizer::{
    ChatMessage, ChatRenderRequest, ChatTemplate, ChatTemplateConfig, SpecialTokenStrings,
};

use crate::model::tokenizer;

/// Longest a render may take. The default fuel is well under a second of work in an
/// optimized build; coverage-instrumented fuzz builds on a shared machine run several
/// times slower (a 100 000-iteration loop, inside the fuel, took 3.6 s there).
const MAX_RENDER: Duration = Duration::from_secs(8);

/// Input: a template source, a NUL byte, then message contents separated by 0x01 (roles
/// alternate user, assistant). An empty template stands for the default model's own.
pub fn chat_template(data: &[u8]) {
    let (source, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let source = String::from_utf8_lossy(source);
    let config = ChatTemplateConfig::default();
    let own;
    let template = if source.is_empty() {
        own = tokenizer();
        match own.chat_template() {
            Ok(t) => t,
            Err(e) => panic!("the default model has no chat template: {e}"),
        }
    } else {
        let specials = SpecialTokenStrings {
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            ..Default::default()
        };
        match ChatTemplate::new(&source, specials, &config) {
            Ok(t) => return render(&t, rest, &config),
            Err(_) => return,
        }
    };
    render(template, rest, &config);
}

fn render(template: &ChatTemplate, rest: &[u8], config: &ChatTemplateConfig) {
    let messages = rest
        .split(|&b| b == 1)
        .enumerate()
        .map(|(i, text)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            ChatMessage::new(role, String::from_utf8_lossy(text))
        })
        .collect();
    let request = ChatRenderRequest {
        messages,
        add_generation_prompt: true,
        tools: None,
        kwargs: Default::default(),
    };
    let start = Instant::now();
    let rendered = template.render(&request);
    let took = start.elapsed();
    assert!(
        took <= MAX_RENDER,
        "rendering took {took:?}: the fuel or output limit does not bound it"
    );
    if let Ok(text) = rendered {
        assert!(
            text.len() <= config.max_output_bytes,
            "rendered {} bytes, over the limit of {}",
            text.len(),
            config.max_output_bytes
        );
    }
}
