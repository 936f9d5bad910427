//! A reply's thinking split from its answer, against the real `tessera serve` and the
//! default model. The model is made to think by a structured-output regex (it has no
//! thinking of its own, and `<think>` is not one token of its vocabulary, so the grammar
//! covers the block); the thinking comes back in `reasoning` and `reasoning_content`,
//! the answer in `content`, the same streamed as whole. A template whose prompt opens
//! the thinking block (as DeepSeek-R1's does) is split from the first token, with no
//! flag, and a grammar waits for that block to end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::{json, Value};

/// ChatML whose assistant turn opens a thinking block.
const OPENS_THINKING: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n\
<think>\n{% endif %}";

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Value {
    let resp = client.post(url).json(body).send().await.expect("request");
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json body")
}

/// The joined `reasoning`, `reasoning_content` and `content` deltas of a stream.
async fn post_stream(client: &reqwest::Client, url: &str, body: &Value) -> [String; 3] {
    let resp = client.post(url).json(body).send().await.expect("request");
    assert_eq!(resp.status(), 200);
    let mut out: [String; 3] = Default::default();
    for line in resp.text().await.unwrap().lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        for c in chunk["choices"].as_array().unwrap() {
            for (i, key) in ["reasoning", "reasoning_content", "content"]
                .iter()
                .enumerate()
            {
                out[i].push_str(c["delta"][key].as_str().unwrap_or(""));
            }
        }
    }
    out
}

fn question(regex: &str) -> Value {
    json!({"model": "smollm2", "temperature": 0, "max_tokens": 60,
           "messages": [{"role": "user", "content": "Is Paris in France?"}],
           "structured_outputs": {"regex": regex}})
}

/// Checks the split of one reply, whole and streamed, and returns the thinking.
async fn check_split(base: &str, regex: &str) -> String {
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/chat/completions");
    let whole = post(&client, &url, &question(regex)).await;
    let message = &whole["choices"][0]["message"];
    let reasoning = message["reasoning"].as_str().unwrap().to_string();
    assert_eq!(message["reasoning_content"], message["reasoning"]);
    assert!(
        !reasoning.is_empty()
            && reasoning
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == ' '),
        "{message}"
    );
    let content = message["content"].as_str().unwrap();
    assert!(content == "yes" || content == "no", "{message}");
    let mut streamed = question(regex);
    streamed["stream"] = json!(true);
    let [r, rc, c] = post_stream(&client, &url, &streamed).await;
    assert_eq!(
        (r.as_str(), rc.as_str(), c.as_str()),
        (reasoning.as_str(), reasoning.as_str(), content)
    );
    reasoning
}

#[tokio::test(flavor = "multi_thread")]
async fn thinking_goes_to_reasoning_and_the_answer_to_content() {
    let started = common::start_serve(&[], &["--reasoning-parser", "think"], &[]);
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    check_split(&started.base, "<think>\n[a-z ]{1,30}\n</think>\n\n(yes|no)").await;
    // A reply without a thinking block is all answer, with no reasoning field.
    let plain = post(
        &client,
        &format!("{}/v1/chat/completions", started.base),
        &question("(yes|no)"),
    )
    .await;
    let message = &plain["choices"][0]["message"];
    assert!(message.get("reasoning").is_none(), "{message}");
    assert!(["yes", "no"].contains(&message["content"].as_str().unwrap()));
    // `<think>` is not one token of this vocabulary, so a reply cannot open a block
    // before its grammar: the JSON starts at the first token.
    let mut json_reply = question("x");
    json_reply
        .as_object_mut()
        .unwrap()
        .remove("structured_outputs");
    json_reply["response_format"] = json!({"type": "json_object"});
    let out = post(
        &client,
        &format!("{}/v1/chat/completions", started.base),
        &json_reply,
    )
    .await;
    let message = &out["choices"][0]["message"];
    let content: Value = serde_json::from_str(message["content"].as_str().unwrap()).unwrap();
    assert!(
        content.is_object() && message.get("reasoning").is_none(),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_that_opens_thinking_is_split_by_default() {
    let (started, _template) = common::start_with_template("opens-thinking", OPENS_THINKING);
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;

    // The Responses API gives the thinking as a reasoning item, streamed or whole. The
    // model never closes the block here, so the whole output is thinking.
    let chat = post(
        &client,
        &format!("{}/v1/chat/completions", started.base),
        &json!({"model": "smollm2", "temperature": 0, "max_tokens": 12,
                "messages": [{"role": "user", "content": "Is Paris in France?"}]}),
    )
    .await;
    let thinking = chat["choices"][0]["message"]["reasoning"].as_str().unwrap();
    assert!(chat["choices"][0]["message"]["content"] == "", "{chat}");
    // A grammar waits for the thinking to end: the same free thinking under a JSON
    // format (this model never closes the block, so no JSON follows).
    let constrained = post(
        &client,
        &format!("{}/v1/chat/completions", started.base),
        &json!({"model": "smollm2", "temperature": 0, "max_tokens": 12,
                "messages": [{"role": "user", "content": "Is Paris in France?"}],
                "response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(
        constrained["choices"][0]["message"],
        chat["choices"][0]["message"]
    );
    let url = format!("{}/v1/responses", started.base);
    let body = json!({"model": "smollm2", "temperature": 0, "max_output_tokens": 12,
                      "input": "Is Paris in France?"});
    let whole = post(&client, &url, &body).await;
    let output = whole["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{whole}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(output[0]["content"][0]["text"], thinking);
    assert_eq!(whole["status"], "incomplete");
    let counted = whole["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        (10..=14).contains(&counted),
        "{counted} thinking tokens of 12 generated"
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let resp = client.post(&url).json(&streamed).send().await.unwrap();
    let mut deltas = String::new();
    let mut kinds = Vec::new();
    for line in resp.text().await.unwrap().lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let event: Value = serde_json::from_str(data).unwrap();
        let kind = event["type"].as_str().unwrap().to_string();
        if kind == "response.reasoning_text.delta" {
            deltas.push_str(event["delta"].as_str().unwrap());
        }
        if kind == "response.reasoning_text.done" {
            assert_eq!(event["text"], thinking);
        }
        if kind == "response.incomplete" {
            let item = &event["response"]["output"][0];
            assert_eq!(
                (&item["type"], &item["content"]),
                (&output[0]["type"], &output[0]["content"])
            );
        }
        if kinds.last() != Some(&kind) {
            kinds.push(kind);
        }
    }
    assert_eq!(deltas, thinking);
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.incomplete"
        ]
    );
}
