//! Thinking in the Messages API, on the real binary with the default model behind a
//! chat template that opens a `<think>` block for every reply: a budget caps the block
//! (its closing tag is forced once the budget is spent, and the reply goes on to its
//! answer), and `disabled` closes it at once on a template that cannot be told not to
//! think.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::{json, Value};

const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

async fn message(client: &reqwest::Client, base: &str, thinking: Option<Value>) -> Value {
    let mut body = json!({"model": "smollm2", "max_tokens": 48, "temperature": 0,
        "messages": [{"role": "user", "content": "Explain in detail why the sky is blue."}]});
    if let Some(t) = thinking {
        body["thinking"] = t;
    }
    let (status, reply) = common::post_json(client, &format!("{base}/v1/messages"), &body).await;
    assert_eq!(status, 200, "{reply}");
    reply
}

fn block<'a>(reply: &'a Value, kind: &str) -> Option<&'a str> {
    reply["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == kind)
        .and_then(|b| b[if kind == "text" { "text" } else { "thinking" }].as_str())
}

async fn tokens(client: &reqwest::Client, base: &str, text: &str) -> usize {
    let (_, tok) = common::post_json(
        client,
        &format!("{base}/tokenize"),
        &json!({"prompt": text, "add_special_tokens": false}),
    )
    .await;
    tok["count"].as_u64().unwrap() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_caps_the_block_and_disabled_closes_it() {
    let (started, _file) = common::start_with_template("thinking", THINKING_TEMPLATE);
    let base = started.base.clone();
    let client = reqwest::Client::new();
    common::wait_ready(&client, &base, Duration::from_secs(120)).await;

    // Left alone, the model thinks past any small budget.
    let free = message(&client, &base, None).await;
    let free_thinking = block(&free, "thinking").expect("a thinking block");
    assert!(tokens(&client, &base, free_thinking).await > 8, "{free}");

    let capped = message(
        &client,
        &base,
        Some(json!({"type": "enabled", "budget_tokens": 5})),
    )
    .await;
    let thinking = block(&capped, "thinking").expect("a thinking block");
    let n = tokens(&client, &base, thinking).await;
    assert!((1..=6).contains(&n), "{n} tokens of thinking: {capped}");
    // The same greedy start, cut where the budget ran out.
    assert!(
        free_thinking.starts_with(thinking.trim_end()),
        "{free_thinking:?} / {thinking:?}"
    );
    let answer = block(&capped, "text").expect("an answer after the thinking");
    assert!(!answer.trim().is_empty(), "{capped}");

    let off = message(&client, &base, Some(json!({"type": "disabled"}))).await;
    assert_eq!(block(&off, "thinking"), None, "{off}");
    assert!(
        block(&off, "text").is_some_and(|t| !t.trim().is_empty()),
        "{off}"
    );
    drop(started);
}
