//! How a chat becomes its prompt, against the real `tessera serve` and the default model:
//! `chat_template_kwargs` reach the template, `continue_final_message` ends the prompt
//! inside the final message (the answer continues it exactly as a plain completion of
//! that text does), and `add_generation_prompt: false` leaves the assistant turn unopened.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::json;

/// ChatML, with an optional system line from a template variable.
const TEMPLATE: &str = "{%- if system_hint is defined %}<|im_start|>system\n\
{{ system_hint }}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n\
{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n\
{% endif %}";

#[tokio::test(flavor = "multi_thread")]
async fn kwargs_continuation_and_generation_prompt_shape_the_prompt() {
    let (started, _template) = common::start_with_template("chatml", TEMPLATE);
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let base = &started.base;
    let tokenize = format!("{base}/tokenize");
    let chat_url = format!("{base}/v1/chat/completions");
    let text_url = format!("{base}/v1/completions");
    let question = "What is the capital of France?";
    let user = json!([{"role": "user", "content": question}]);

    // The same tokens as the text the template makes, from /tokenize and the chat route.
    let cases = [
        (
            json!({"chat_template_kwargs": {"system_hint": "Answer in French."}}),
            format!(
                "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\n{question}\
                 <|im_end|>\n<|im_start|>assistant\n"
            ),
        ),
        (
            json!({"add_generation_prompt": false}),
            format!("<|im_start|>user\n{question}<|im_end|>\n"),
        ),
        (
            json!({}),
            format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"),
        ),
    ];
    for (fields, text) in cases {
        let mut body = json!({"messages": user});
        let mut chat = json!({"model": "smollm2", "messages": user, "max_tokens": 1});
        for (k, v) in fields.as_object().unwrap() {
            body[k] = v.clone();
            chat[k] = v.clone();
        }
        let (status, from_messages) = common::post_json(&client, &tokenize, &body).await;
        assert_eq!(status, 200, "{from_messages}");
        let (_, from_text) = common::post_json(
            &client,
            &tokenize,
            &json!({"prompt": text, "add_special_tokens": false}),
        )
        .await;
        assert_eq!(from_messages["tokens"], from_text["tokens"], "{fields}");
        let (status, out) = common::post_json(&client, &chat_url, &chat).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(
            out["usage"]["prompt_tokens"], from_text["count"],
            "{fields}"
        );
    }

    // A continued answer is the plain completion of the prompt cut inside the final
    // message: the same tokens, greedy.
    let partial = "The capital of France is";
    let conversation = json!([
        {"role": "user", "content": question},
        {"role": "assistant", "content": partial}
    ]);
    let (status, continued) = common::post_json(
        &client,
        &chat_url,
        &json!({"model": "smollm2", "messages": conversation, "continue_final_message": true,
                "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{continued}");
    let prompt =
        format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{partial}");
    let (status, plain) = common::post_json(
        &client,
        &text_url,
        &json!({"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(status, 200, "{plain}");
    let text = continued["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert!(!text.is_empty());
    assert_eq!(text, plain["choices"][0]["text"].as_str().unwrap());
    assert_eq!(continued["usage"], plain["usage"]);

    // Refusals name the field.
    let refused = [
        (
            json!({"messages": conversation, "continue_final_message": true,
                   "add_generation_prompt": true}),
            "continue_final_message",
        ),
        (
            json!({"messages": user, "chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs",
        ),
        (
            json!({"messages": user, "chat_template_kwargs": "enable_thinking"}),
            "chat_template_kwargs",
        ),
    ];
    for (fields, param) in refused {
        let mut body = fields.clone();
        body["model"] = json!("smollm2");
        let (status, out) = common::post_json(&client, &chat_url, &body).await;
        assert_eq!(status, 400, "{fields}: {out}");
        assert_eq!(out["error"]["param"], param, "{out}");
    }
}
