//! vLLM's stop and detokenizing fields against the real `tessera serve` and the default
//! model, each against the plain greedy answer: `stop_token_ids` ends it at that token,
//! `include_stop_str_in_output` keeps what ended it, `min_tokens` masks the
//! end-of-sequence token until enough are generated, `skip_special_tokens: false`
//! writes the special tokens out. vLLM fields the server cannot honour get a 400.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::{json, Value};

struct Server {
    client: reqwest::Client,
    base: String,
}

impl Server {
    async fn ok(&self, route: &str, body: Value) -> Value {
        let (status, out) =
            common::post_json(&self.client, &format!("{}{route}", self.base), &body).await;
        assert_eq!(status, 200, "{body}: {out}");
        out
    }

    async fn tokens(&self, text: &str) -> Vec<u64> {
        let out = self
            .ok(
                "/tokenize",
                json!({"prompt": text, "add_special_tokens": false}),
            )
            .await;
        out["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    }

    async fn detokenize(&self, ids: &[u64]) -> String {
        let out = self.ok("/detokenize", json!({"tokens": ids})).await;
        out["prompt"].as_str().unwrap().to_string()
    }
}

fn text_of(out: &Value) -> (String, String, u64) {
    let c = &out["choices"][0];
    let text = c["message"]["content"].as_str().or(c["text"].as_str());
    (
        text.unwrap().to_string(),
        c["finish_reason"].as_str().unwrap().to_string(),
        out["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_tokens_min_tokens_and_special_tokens_shape_the_greedy_answer() {
    let started = common::start_serve(&[], &[], &[]);
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(300)).await;
    let s = Server {
        client,
        base: started.base.clone(),
    };

    // `stop_token_ids`: the answer ends at the third generated token.
    let prompt = "The capital of France is";
    let completion = |extra: Value| {
        let mut body =
            json!({"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let (full, _, n) = text_of(&s.ok("/v1/completions", completion(json!({}))).await);
    let before = s.tokens(prompt).await;
    let all = s.tokens(&format!("{prompt}{full}")).await;
    let generated = &all[before.len()..];
    assert_eq!(
        generated.len() as u64,
        n,
        "{full:?} does not retokenize as generated"
    );
    let stop = generated[2];
    assert!(
        !generated[..2].contains(&stop),
        "pick a token that first occurs third"
    );
    let body = completion(json!({"stop_token_ids": [stop]}));
    let (text, reason, n) = text_of(&s.ok("/v1/completions", body).await);
    assert_eq!((reason.as_str(), n), ("stop", 3));
    assert_eq!(text, s.detokenize(&generated[..2]).await);
    let body = completion(json!({"stop_token_ids": [stop], "include_stop_str_in_output": true}));
    let (text, _, _) = text_of(&s.ok("/v1/completions", body).await);
    assert_eq!(text, s.detokenize(&generated[..3]).await);
    // With `ignore_eos` the request's own stop tokens still end it.
    let body = completion(json!({"stop_token_ids": [stop], "ignore_eos": true}));
    assert_eq!(text_of(&s.ok("/v1/completions", body).await).2, 3);

    // `min_tokens`: an answer that ends by itself goes on past its end-of-sequence token,
    // with the same text up to there.
    let chat = |extra: Value| {
        let mut body = json!({"model": "smollm2", "temperature": 0, "max_tokens": 60,
                              "messages": [{"role": "user", "content": "Say hello."}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let (short, reason, n) = text_of(&s.ok("/v1/chat/completions", chat(json!({}))).await);
    assert_eq!(reason, "stop", "{short:?}");
    let min = n + 5;
    let body = chat(json!({"min_tokens": min}));
    let (long, _, m) = text_of(&s.ok("/v1/chat/completions", body).await);
    assert!(m >= min, "{m} tokens, at least {min} asked: {long:?}");
    assert!(
        long.starts_with(&short),
        "{long:?} does not continue {short:?}"
    );
    assert!(long.len() > short.len());

    // `skip_special_tokens: false` with the stop kept: the end-of-turn token is written.
    let body = chat(json!({"skip_special_tokens": false, "include_stop_str_in_output": true}));
    let (with_eos, _, _) = text_of(&s.ok("/v1/chat/completions", body).await);
    assert_eq!(with_eos, format!("{short}<|im_end|>"));
    let body = chat(json!({"skip_special_tokens": false}));
    assert_eq!(text_of(&s.ok("/v1/chat/completions", body).await).0, short);

    // Fields that cannot be honoured, or values out of range, are refused by name.
    let chat_url = format!("{}/v1/chat/completions", s.base);
    let text_url = format!("{}/v1/completions", s.base);
    let refused = [
        (
            &text_url,
            completion(json!({"use_beam_search": true})),
            "use_beam_search",
        ),
        (&text_url, completion(json!({"priority": 2})), "priority"),
        (
            &text_url,
            completion(json!({"prompt_logprobs": 1})),
            "prompt_logprobs",
        ),
        (
            &text_url,
            completion(json!({"allowed_token_ids": [10_000_000]})),
            "allowed_token_ids",
        ),
        (
            &text_url,
            completion(json!({"truncate_prompt_tokens": 0})),
            "truncate_prompt_tokens",
        ),
        (
            &text_url,
            completion(json!({"stop_token_ids": [10_000_000]})),
            "stop_token_ids",
        ),
        (
            &text_url,
            completion(json!({"min_tokens": 13})),
            "min_tokens",
        ),
        (
            &text_url,
            completion(json!({"min_tokens": 2, "guided_choice": ["a"]})),
            "min_tokens",
        ),
        (&chat_url, chat(json!({"echo": true})), "echo"),
        (
            &chat_url,
            chat(
                json!({"allowed_token_ids": [1], "tool_choice": "required", "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
                ]}),
            ),
            "allowed_token_ids",
        ),
        (
            &chat_url,
            chat(json!({"chat_template": "{{ messages }}"})),
            "chat_template",
        ),
    ];
    for (url, body, param) in refused {
        let (status, out) = common::post_json(&s.client, url, &body).await;
        assert_eq!(status, 400, "{body}: {out}");
        assert_eq!(out["error"]["param"], param, "{out}");
    }
    // `allowed_token_ids`: every token of the answer is one of them.
    let yes_no = [s.tokens(" yes").await, s.tokens(" no").await].concat();
    assert_eq!(yes_no.len(), 2, "one token each");
    let body = completion(json!({"allowed_token_ids": yes_no, "max_tokens": 6}));
    let (text, _, n) = text_of(&s.ok("/v1/completions", body).await);
    assert_eq!(n, 6);
    assert_eq!(text.replace(" yes", "").replace(" no", ""), "", "{text:?}");
    // `bad_words`: the greedy answer names Paris; barred, it does not.
    assert!(full.contains(" Paris"), "{full:?}");
    let body = completion(json!({"bad_words": ["Paris"]}));
    let (text, _, _) = text_of(&s.ok("/v1/completions", body).await);
    assert!(!text.contains("Paris") && text != full, "{text:?}");
    // `truncate_prompt_tokens`: the answer to the prompt's last tokens, which are echoed.
    let last = &before[before.len() - 3..];
    let body = completion(json!({"truncate_prompt_tokens": 3, "echo": true}));
    let out = s.ok("/v1/completions", body).await;
    let body = completion(json!({"prompt": last}));
    let (tail, _, _) = text_of(&s.ok("/v1/completions", body).await);
    assert_eq!(out["usage"]["prompt_tokens"], 3);
    let echoed = format!("{}{tail}", s.detokenize(last).await);
    assert_eq!(out["choices"][0]["text"], echoed.as_str());
    // Their defaults are accepted.
    let body = completion(
        json!({"use_beam_search": false, "priority": 0, "length_penalty": 1.0,
                                 "bad_words": [], "stop_token_ids": []}),
    );
    assert_eq!(text_of(&s.ok("/v1/completions", body).await).0, full);
}

/// `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`, in tokens,
/// once the queries reach `queries` (the engine publishes its counters after the step
/// that answered the request).
async fn prefix_counters(client: &reqwest::Client, base: &str, queries: f64) -> (f64, f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let counter = |name: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(name))
                .find_map(|l| l.split_whitespace().last()?.parse().ok())
                .expect("a prefix-cache counter")
        };
        let now = (
            counter("vllm:prefix_cache_queries_total"),
            counter("vllm:prefix_cache_hits_total"),
        );
        if now.0 >= queries || std::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cache_salt_keeps_cached_prompts_to_requests_with_the_same_salt() {
    let started = common::start_serve(&[], &[], &[]);
    let client = reqwest::Client::new();
    let base = &started.base;
    common::wait_ready(&client, base, Duration::from_secs(300)).await;
    let prompt = "The history of the city of Paris goes back more than two thousand years, \
                  from a settlement of the Parisii on an island in the Seine to the capital \
                  of a kingdom, an empire and a republic, and one of the great cities of the \
                  world, with its bridges, its boulevards and its museums.";
    let url = format!("{base}/v1/completions");
    let (mut queries, mut hits) = prefix_counters(&client, base, 0.0).await;
    // (salt, whether the prompt is cached under it by then)
    let runs = [
        (Some("tenant-a"), false),
        (Some("tenant-a"), true),
        (Some("tenant-b"), false),
        (None, false),
        (None, true),
        (Some("tenant-b"), true),
    ];
    for (salt, cached) in runs {
        let mut body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 1});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        let (status, out) = common::post_json(&client, &url, &body).await;
        assert_eq!(status, 200, "{out}");
        let prompt_tokens = out["usage"]["prompt_tokens"].as_f64().unwrap();
        let (q, now) = prefix_counters(&client, base, queries + prompt_tokens).await;
        assert_eq!(q, queries + prompt_tokens);
        queries = q;
        match cached {
            true => assert!(
                now - hits >= prompt_tokens - 16.0,
                "{salt:?}: {hits} -> {now}"
            ),
            false => assert_eq!(now, hits, "{salt:?} hit another salt's blocks"),
        }
        hits = now;
    }
    let (status, out) = common::post_json(
        &client,
        &url,
        &json!({"model": "smollm2", "prompt": "x", "cache_salt": ""}),
    )
    .await;
    assert_eq!(
        (status, out["error"]["param"].as_str()),
        (400, Some("cache_salt"))
    );
}
