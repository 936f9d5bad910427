//! `/v1/responses` log-probabilities over the real model: included on request in the
//! `output_text` part and in every text delta, absent (an empty list) otherwise, and
//! refused where they cannot be honoured.

use serde_json::{json, Value};

use super::harness::*;

const LOGPROBS: &str = "message.output_text.logprobs";

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": "smollm2",
        "input": "What is the capital of France? Answer in one sentence.",
        "temperature": 0,
        "max_output_tokens": 8
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Greedy: each chosen token is the first of its alternatives, log-probabilities are
/// at most 0, and the tokens spell the text and then the end-of-turn token that ended it
/// (an output token too, as in chat's log-probabilities).
fn check_greedy(logprobs: &[Value], text: &str, top: usize) {
    let mut spelled = String::new();
    for lp in logprobs {
        let token = lp["token"].as_str().unwrap();
        spelled.push_str(token);
        let logprob = lp["logprob"].as_f64().unwrap();
        assert!(logprob <= 0.0, "{lp}");
        assert_eq!(lp["bytes"], json!(token.as_bytes()), "{lp}");
        let alternatives = lp["top_logprobs"].as_array().unwrap();
        assert_eq!(alternatives.len(), top, "{lp}");
        assert_eq!(alternatives[0]["token"], token, "{lp}");
        assert_eq!(
            alternatives[0]["logprob"].as_f64().unwrap(),
            logprob,
            "{lp}"
        );
        if top > 1 {
            let second = alternatives[1]["logprob"].as_f64().unwrap();
            assert!(second <= logprob, "{lp}");
        }
    }
    assert_eq!(spelled, format!("{text}<|im_end|>"));
}

#[tokio::test]
async fn included_logprobs_fill_the_output_text_and_its_deltas() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let url = s.url("/v1/responses");
    let with = json!({"include": [LOGPROBS], "top_logprobs": 2});
    let (status, body) = post(&url, &ask(with.clone())).await;
    assert_eq!(status, 200, "{body}");
    let part = &body["output"][0]["content"][0];
    assert_eq!(part["type"], "output_text");
    let text = part["text"].as_str().unwrap();
    assert!(text.starts_with("The capital of France"), "{text}");
    let logprobs = part["logprobs"].as_array().unwrap();
    assert_eq!(
        logprobs.len() as u64,
        body["usage"]["output_tokens"].as_u64().unwrap(),
        "one entry per output token"
    );
    check_greedy(logprobs, text, 2);

    // Streamed: each delta carries its own tokens; together they are the final list.
    let mut streamed = with;
    streamed["stream"] = json!(true);
    let (status, events) = post_sse(&url, &ask(streamed)).await;
    assert_eq!(status, 200);
    // As OpenAI's: the stream ends with `response.completed`, no `[DONE]`.
    let events: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut delta_logprobs = Vec::new();
    let mut delta_text = String::new();
    for e in events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
    {
        delta_text.push_str(e["delta"].as_str().unwrap());
        delta_logprobs.extend(e["logprobs"].as_array().unwrap().iter().cloned());
    }
    assert_eq!(delta_text, text);
    assert_eq!(&delta_logprobs, logprobs, "same tokens streamed and not");
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .unwrap();
    assert_eq!(done["logprobs"].as_array().unwrap(), logprobs);
    let completed = events.last().unwrap();
    assert_eq!(completed["type"], "response.completed");
    assert_eq!(
        completed["response"]["output"][0]["content"][0]["logprobs"]
            .as_array()
            .unwrap(),
        logprobs
    );

    // Not asked for: none computed, the list is empty.
    let (status, plain) = post(&url, &ask(json!({}))).await;
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain["output"][0]["content"][0]["text"], text);
    assert_eq!(plain["output"][0]["content"][0]["logprobs"], json!([]));
}

#[tokio::test]
async fn logprobs_that_cannot_be_honoured_are_refused() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let url = s.url("/v1/responses");
    let tool = json!({"type": "function", "name": "f", "parameters": {"type": "object"}});
    for (extra, param) in [
        (
            json!({"include": ["reasoning.encrypted_content"]}),
            "include",
        ),
        (json!({"include": LOGPROBS}), "include"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (
            json!({"include": [LOGPROBS], "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"include": [LOGPROBS], "tools": [tool]}), "include"),
    ] {
        let (status, body) = post(&url, &ask(extra.clone())).await;
        assert_error(status, &body, 400, Some(param));
        assert!(
            body["error"]["message"].as_str().unwrap().contains(param),
            "{extra}: {body}"
        );
    }
}

/// A reasoning effort the model's template cannot take is refused naming the Responses
/// field the client sent, not chat's.
#[tokio::test]
async fn an_effort_the_template_cannot_take_is_refused_as_reasoning_effort() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (status, body) = post(
        &s.url("/v1/responses"),
        &ask(json!({"reasoning": {"effort": "high"}})),
    )
    .await;
    assert_error(status, &body, 400, Some("reasoning.effort"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("`reasoning.effort` is not supported"),
        "{message}"
    );
    let (status, body) = post(
        &s.url("/v1/responses"),
        &ask(json!({"reasoning": {"effort": "extreme"}})),
    )
    .await;
    assert_error(status, &body, 400, Some("reasoning.effort"));
}
