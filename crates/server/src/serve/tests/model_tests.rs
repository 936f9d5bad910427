//! Generation over the real model: exact greedy text, streaming, sampling parameters,
//! logprobs, stop strings, n, and cancellation on client disconnect.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::harness::*;

const FRANCE_ANSWER: &str = "The capital of France is Paris.";

fn text(body: &Value, i: usize) -> String {
    body["choices"][i]["message"]["content"]
        .as_str()
        .or_else(|| body["choices"][i]["text"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn chat_greedy_answers_exactly_with_usage() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (status, body) = post(&s.url("/v1/chat/completions"), &france(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(text(&body, 0), FRANCE_ANSWER);
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["model"], "smollm2");
    assert_eq!(body["choices"][0]["index"], 0);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    // The prompt is what /tokenize makes of the same messages.
    let (_, tok) = post(
        &s.url("/tokenize"),
        &json!({"messages": france(json!({}))["messages"]}),
    )
    .await;
    let u = &body["usage"];
    assert_eq!(u["prompt_tokens"], tok["count"]);
    let completion = u["completion_tokens"].as_u64().unwrap();
    assert!((7..=9).contains(&completion), "{u}");
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + completion
    );
}

#[tokio::test]
async fn chat_stream_matches_non_stream_and_orders_chunks() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (status, events) = post_sse(
        &s.url("/v1/chat/completions"),
        &france(json!({"stream": true, "stream_options": {"include_usage": true}})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
    }
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let content: String = chunks[..chunks.len() - 2]
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, FRANCE_ANSWER);
    for c in &chunks[..chunks.len() - 2] {
        assert!(c["choices"][0]["finish_reason"].is_null());
    }
    let (_, plain) = post(&s.url("/v1/chat/completions"), &france(json!({}))).await;
    assert_eq!(usage["usage"], plain["usage"]);
}

#[tokio::test]
async fn stop_string_cuts_text_in_both_modes() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let body = france(json!({"stop": [" Paris", "zzz"]}));
    let (status, plain) = post(&s.url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{plain}");
    assert_eq!(text(&plain, 0), "The capital of France is");
    assert_eq!(plain["choices"][0]["finish_reason"], "stop");
    // Tokens up to the one completing the stop string are counted, no more.
    assert!(plain["usage"]["completion_tokens"].as_u64().unwrap() <= 7);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, events) = post_sse(&s.url("/v1/chat/completions"), &streamed).await;
    let content: String = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            let v: Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(content, "The capital of France is");
}

#[tokio::test]
async fn max_tokens_ends_with_length() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    for key in ["max_tokens", "max_completion_tokens"] {
        let mut body = france(json!({}));
        body.as_object_mut().unwrap().remove("max_tokens");
        body[key] = json!(3);
        let (status, out) = post(&s.url("/v1/chat/completions"), &body).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["choices"][0]["finish_reason"], "length");
        assert_eq!(out["usage"]["completion_tokens"], 3);
        assert_eq!(text(&out, 0), "The capital of");
    }
}

#[tokio::test]
async fn seeded_sampling_repeats_and_n_uses_seed_plus_index() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let url = s.url("/v1/chat/completions");
    let sampled = |seed: u64, n: u64| {
        france(json!({"temperature": 1.0, "seed": seed, "n": n, "max_tokens": 6, "user": "u-1"}))
    };
    let (_, a) = post(&url, &sampled(11, 1)).await;
    let (_, b) = post(&url, &sampled(11, 1)).await;
    assert_eq!(text(&a, 0), text(&b, 0));
    let (status, two) = post(&url, &sampled(11, 2)).await;
    assert_eq!(status, 200, "{two}");
    assert_eq!(two["choices"].as_array().unwrap().len(), 2);
    assert_eq!(two["choices"][0]["index"], 0);
    assert_eq!(two["choices"][1]["index"], 1);
    assert_eq!(text(&two, 0), text(&a, 0));
    let (_, c) = post(&url, &sampled(12, 1)).await;
    assert_eq!(text(&two, 1), text(&c, 0));
    assert!(two["usage"]["completion_tokens"].as_u64().unwrap() <= 12);
}

#[tokio::test]
async fn sampling_filters_and_penalties_are_accepted() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let body = france(json!({
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3,
        "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1,
        "max_tokens": 4, "response_format": {"type": "text"}, "tool_choice": "none",
        "tools": [], "some_unknown_field": {"x": 1}, "best_of": 1
    }));
    let (status, out) = post(&s.url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn logit_bias_forces_a_token() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (_, tok) = post(
        &s.url("/tokenize"),
        &json!({"prompt": " banana", "add_special_tokens": false}),
    )
    .await;
    let id = tok["tokens"][0].as_u64().unwrap();
    let body = json!({
        "model": "smollm2", "prompt": "The capital of France is", "max_tokens": 1,
        "temperature": 0, "logit_bias": {id.to_string(): 100}
    });
    let (status, out) = post(&s.url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{out}");
    let (_, detok) = post(&s.url("/detokenize"), &json!({"tokens": [id]})).await;
    assert_eq!(text(&out, 0), detok["prompt"].as_str().unwrap());
}

#[tokio::test]
async fn chat_logprobs_have_openai_shape() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let (status, out) = post(
        &s.url("/v1/chat/completions"),
        &france(json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 3})),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let content = out["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    let joined: String = content
        .iter()
        .map(|c| c["token"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text(&out, 0));
    for entry in content {
        let lp = entry["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
        assert_eq!(bytes, entry["token"].as_str().unwrap().as_bytes());
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the chosen token is the most likely one.
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-4);
        assert!(top[0]["bytes"].is_array());
    }
    // Without logprobs the field is null.
    let (_, plain) = post(
        &s.url("/v1/chat/completions"),
        &france(json!({"max_tokens": 1})),
    )
    .await;
    assert!(plain["choices"][0]["logprobs"].is_null());
}

#[tokio::test]
async fn completions_prompts_echo_logprobs_and_stream() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let url = s.url("/v1/completions");
    let base = json!({"model": "smollm2", "prompt": "Paris is the capital of", "max_tokens": 3, "temperature": 0});
    let (status, one) = post(&url, &base).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["object"], "text_completion");
    assert!(one["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(one["choices"][0]["finish_reason"], "length");
    assert_eq!(one["usage"]["completion_tokens"], 3);
    let greedy = text(&one, 0);

    // A list of prompts: one choice per prompt, prompt tokens summed once each.
    let mut many = base.clone();
    many["prompt"] = json!(["Paris is the capital of", "Paris is the capital of"]);
    let (_, two) = post(&url, &many).await;
    assert_eq!(two["choices"].as_array().unwrap().len(), 2);
    assert_eq!(text(&two, 1), greedy);
    assert_eq!(
        two["usage"]["prompt_tokens"].as_u64().unwrap(),
        2 * one["usage"]["prompt_tokens"].as_u64().unwrap()
    );

    // Token ids, and lists of token ids.
    let (_, tok) = post(
        &s.url("/tokenize"),
        &json!({"prompt": "Paris is the capital of"}),
    )
    .await;
    let mut ids = base.clone();
    ids["prompt"] = tok["tokens"].clone();
    let (_, by_ids) = post(&url, &ids).await;
    assert_eq!(text(&by_ids, 0), greedy);
    ids["prompt"] = json!([tok["tokens"].clone()]);
    let (_, by_lists) = post(&url, &ids).await;
    assert_eq!(text(&by_lists, 0), greedy);

    // Echo.
    let mut echo = base.clone();
    echo["echo"] = json!(true);
    let (_, echoed) = post(&url, &echo).await;
    assert_eq!(text(&echoed, 0), format!("Paris is the capital of{greedy}"));

    // Logprobs (int): tokens, token_logprobs, top_logprobs, text_offset.
    let mut lp = base.clone();
    lp["logprobs"] = json!(2);
    let (_, with_lp) = post(&url, &lp).await;
    let l = &with_lp["choices"][0]["logprobs"];
    assert_eq!(l["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(l["token_logprobs"].as_array().unwrap().len(), 3);
    assert_eq!(l["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(l["text_offset"][0], 0);
    let joined: String = l["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, greedy);

    // Streaming gives the same text, then usage, then [DONE].
    let mut st = base.clone();
    st["stream"] = json!(true);
    st["stream_options"] = json!({"include_usage": true});
    let (_, events) = post_sse(&url, &st).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, greedy);
    assert_eq!(chunks.last().unwrap()["usage"], one["usage"]);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );
}

async fn wait_for_idle(state: &crate::serve::state::AppState) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = state.scheduler.metrics();
        if m.num_running == 0 && m.num_waiting == 0 && m.kv_blocks_in_use == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "sequence not freed: {m:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn client_disconnect_mid_stream_frees_the_sequence() {
    let _gate = SCHEDULER_GATE.write().await;
    let s = model_server();
    let body = france(json!({"stream": true, "max_tokens": 400, "ignore_eos": true}));
    let resp = reqwest::Client::new()
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    // Read until some generated text arrived, so the sequence is running.
    let mut seen = String::new();
    while !seen.contains("capital") {
        let chunk = stream.next().await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(s.state.scheduler.metrics().kv_blocks_in_use > 0);
    drop(stream);
    wait_for_idle(&s.state).await;
}

#[tokio::test]
async fn client_disconnect_without_stream_frees_the_sequence() {
    let _gate = SCHEDULER_GATE.write().await;
    let s = model_server();
    // 1000 tokens take seconds on a CPU; the client gives up after 800 ms. (400 tokens
    // once finished inside the client's earlier 1.5 s.)
    let max_tokens = 1000;
    let body = france(json!({"max_tokens": max_tokens, "ignore_eos": true}));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    let before = s.state.scheduler.metrics().generation_tokens_total;
    let result = client
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await;
    assert!(result.is_err(), "the request should time out on the client");
    wait_for_idle(&s.state).await;
    // Freed because the client left, not because the reply ran to its end.
    let generated = s.state.scheduler.metrics().generation_tokens_total - before;
    assert!(generated < max_tokens, "{generated} tokens generated");
}

/// The text of the first `n` of `tokens` (a `logprobs.tokens` array).
fn prompt_text_of(tokens: &[Value], n: usize) -> String {
    tokens[..n].iter().map(|t| t.as_str().unwrap()).collect()
}

#[tokio::test]
async fn completions_echo_with_logprobs_scores_the_prompt() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let url = s.url("/v1/completions");
    let (_, tok) = post(
        &s.url("/tokenize"),
        &json!({"prompt": "The capital of France is Paris, and the capital of Italy is"}),
    )
    .await;
    let ids: Vec<u64> = tok["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let n = ids.len();
    let body = json!({"model": "smollm2", "prompt": ids, "max_tokens": 2, "temperature": 0,
                      "echo": true, "logprobs": 5});
    let (status, echoed) = post(&url, &body).await;
    assert_eq!(status, 200, "{echoed}");
    let l = &echoed["choices"][0]["logprobs"];
    let tokens = l["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len(),
        n + 2,
        "the prompt's tokens, then the generated ones"
    );
    // The first prompt token is not scored; every later token is, with 5 alternatives.
    assert!(l["token_logprobs"][0].is_null() && l["top_logprobs"][0].is_null());
    for i in 1..n + 2 {
        let lp = l["token_logprobs"][i].as_f64().unwrap();
        assert!(lp <= 0.0, "position {i}: {lp}");
        assert_eq!(l["top_logprobs"][i].as_object().unwrap().len(), 5);
    }
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text(&echoed, 0));
    let offsets: Vec<u64> = l["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0);

    // The last prompt token is scored by the distribution that generating after the
    // tokens before it samples from: the same five alternatives, the same values.
    let (_, shorter) = post(
        &url,
        &json!({"model": "smollm2", "prompt": ids[..n - 1], "max_tokens": 1,
                "temperature": 0, "logprobs": 5}),
    )
    .await;
    let want = shorter["choices"][0]["logprobs"]["top_logprobs"][0]
        .as_object()
        .unwrap()
        .clone();
    let got = l["top_logprobs"][n - 1].as_object().unwrap();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (k, v) in got {
        let (a, b) = (v.as_f64().unwrap(), want[k].as_f64().unwrap());
        assert!((a - b).abs() < 1e-3, "{k}: {a} against {b}");
    }
    // And the generated tokens are those of the same request without echo.
    let (_, plain) = post(
        &url,
        &json!({"model": "smollm2", "prompt": ids, "max_tokens": 2, "temperature": 0}),
    )
    .await;
    assert!(text(&echoed, 0).ends_with(&text(&plain, 0)));

    // Streamed: the first chunk is the prompt with its scores (they come with the first
    // token), then the generated tokens; together the same as the whole response.
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let (status, events) = post_sse(&url, &stream).await;
    assert_eq!(status, 200, "{events:?}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["text"].as_str().unwrap(), prompt_text_of(tokens, n));
    assert_eq!(first["logprobs"]["tokens"], json!(tokens[..n]));
    let mut streamed = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for c in &chunks {
        let lp = &c["choices"][0]["logprobs"];
        if lp.is_null() {
            continue;
        }
        streamed.0.extend(lp["tokens"].as_array().unwrap().clone());
        streamed
            .1
            .extend(lp["token_logprobs"].as_array().unwrap().clone());
        streamed
            .2
            .extend(lp["top_logprobs"].as_array().unwrap().clone());
        streamed
            .3
            .extend(lp["text_offset"].as_array().unwrap().clone());
    }
    assert_eq!(json!(streamed.0), l["tokens"]);
    assert_eq!(json!(streamed.3), l["text_offset"]);
    assert!(streamed.1[0].is_null() && streamed.2[0].is_null());
    for i in 1..n + 2 {
        let (a, b) = (
            streamed.1[i].as_f64().unwrap(),
            l["token_logprobs"][i].as_f64().unwrap(),
        );
        assert!(
            (a - b).abs() < 1e-3,
            "position {i}: {a} streamed, {b} whole"
        );
        assert_eq!(
            streamed.2[i]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            l["top_logprobs"][i]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            "position {i}"
        );
    }
    let streamed_text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed_text, text(&echoed, 0));

    // `max_tokens: 0`: the prompt alone, scored the same; nothing generated.
    let mut zero = body.clone();
    zero["max_tokens"] = json!(0);
    let (status, scored) = post(&url, &zero).await;
    assert_eq!(status, 200, "{scored}");
    let z = &scored["choices"][0]["logprobs"];
    assert_eq!(z["tokens"].as_array().unwrap().len(), n);
    assert_eq!(
        z["token_logprobs"],
        json!(l["token_logprobs"].as_array().unwrap()[..n])
    );
    assert_eq!(
        z["top_logprobs"],
        json!(l["top_logprobs"].as_array().unwrap()[..n])
    );
    assert_eq!(text(&scored, 0), prompt_text_of(tokens, n));
    assert_eq!(scored["choices"][0]["finish_reason"], "length");
    assert_eq!(scored["usage"]["completion_tokens"], 0);
    assert_eq!(scored["usage"]["prompt_tokens"], n);
    // Without echo there would be nothing to return; streamed, it is refused too.
    for (extra, param) in [
        (json!({"echo": false}), "max_tokens"),
        (json!({"stream": true, "logprobs": null}), "max_tokens"),
    ] {
        let mut b = zero.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (status, err) = post(&url, &b).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["param"], param);
    }
}

#[tokio::test]
async fn a_developer_message_is_the_templates_system_message() {
    let _gate = SCHEDULER_GATE.read().await;
    let s = model_server();
    let url = s.url("/v1/chat/completions");
    let with = |role: &str| {
        json!({"model": "smollm2", "temperature": 0, "max_tokens": 8, "messages": [
            {"role": role, "content": "Answer in French."},
            {"role": "user", "content": "What is the capital of France?"}]})
    };
    let (status, developer) = post(&url, &with("developer")).await;
    assert_eq!(status, 200, "{developer}");
    let (_, system) = post(&url, &with("system")).await;
    let (_, user_only) = post(&url, &france(json!({"max_tokens": 8}))).await;
    // The same prompt (the second finds the first's blocks in the prefix cache).
    assert_eq!(
        developer["usage"]["prompt_tokens"],
        system["usage"]["prompt_tokens"]
    );
    assert_eq!(
        developer["usage"]["completion_tokens"],
        system["usage"]["completion_tokens"]
    );
    assert_eq!(text(&developer, 0), text(&system, 0));
    // The instruction is in the prompt: without it the prompt is shorter.
    assert_ne!(
        developer["usage"]["prompt_tokens"],
        user_only["usage"]["prompt_tokens"]
    );
}
