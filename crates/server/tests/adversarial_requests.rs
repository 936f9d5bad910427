//! Hostile requests against the real `tessera serve` (default model): each must be
//! refused or cut short while the server keeps serving everyone else. Schemas and
//! grammars deep enough to overflow the grammar compiler's stack, a large schema with
//! many choices, grammars too complex to enforce, megabytes of prompt, a client that
//! leaves while its request waits or prefills, and one that never reads its stream.
//! Bounds on time are generous (seconds): they separate "cut short" from "ran to the
//! end", not fast from slow.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::hostile::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

const MODEL: &str = "smollm2";

/// The server, its base URL, and its log (kept: dropping it would close the pipe the
/// server writes its log to).
fn start(extra: &[&str]) -> (common::Started, String) {
    let mut args = vec![
        "serve",
        "--port",
        "0",
        "--served-model-name",
        MODEL,
        "--threads-per-rank",
        "1",
    ];
    if !extra.contains(&"--kv-cache-memory-mib") {
        args.extend(["--kv-cache-memory-mib", "128"]);
    }
    args.extend_from_slice(extra);
    let started = common::start(&args, &[("RUST_LOG", "info")]);
    let base = started.base.clone();
    (started, base)
}

async fn ready(base: &str) -> reqwest::Client {
    let client = reqwest::Client::new();
    common::wait_ready(&client, base, Duration::from_secs(120)).await;
    client
}

/// A schema whose `$defs` chain `n` `$ref`s deep.
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let def = match i + 1 < n {
            true => {
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}})
            }
            false => json!({"type": "integer"}),
        };
        defs.insert(format!("d{i}"), def);
    }
    json!({"$ref": "#/$defs/d0", "$defs": defs})
}

/// A Lark grammar whose rule chain is `n` rules long.
fn rule_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        match i + 1 < n {
            true => g.push_str(&format!("r{i}: \"a\" r{}\n", i + 1)),
            false => g.push_str(&format!("r{i}: \"a\"\n")),
        }
    }
    g
}

/// Each way a request can carry a schema or a grammar, with `schema` and `grammar` in
/// it: the route, the body and the field the refusal must name.
fn entry_points(schema: &Value, grammar: &str) -> Vec<(&'static str, Value, &'static str)> {
    let chat = |extra: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let completion = |extra: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 4, "prompt": "Hi"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    vec![
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "deep", "schema": schema}}})),
            "response_format",
        ),
        (
            "/v1/completions",
            completion(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "deep", "schema": schema}}})),
            "response_format",
        ),
        (
            "/v1/completions",
            completion(json!({"structured_outputs": {"json": schema}})),
            "structured_outputs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"guided_json": schema})),
            "guided_json",
        ),
        (
            "/v1/completions",
            completion(json!({"guided_grammar": grammar})),
            "guided_grammar",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"structured_outputs": {"grammar": grammar}})),
            "structured_outputs",
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "Hi", "max_output_tokens": 4,
            "text": {"format": {"type": "json_schema", "name": "deep", "schema": schema}}}),
            "text.format",
        ),
        (
            "/v1/chat/completions",
            chat(json!({
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}})),
            "tools",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_and_grammars_deep_enough_to_overflow_a_stack_are_400s() {
    let (_server, base) = start(&[]);
    let client = ready(&base).await;
    // 220 `$ref`s and 700 rules overflowed a 2 MiB stack inside the compiler, aborting
    // the process; far longer chains too.
    for (schema, grammar) in [
        (ref_chain(220), rule_chain(700)),
        (ref_chain(3000), rule_chain(8000)),
    ] {
        for (route, body, param) in entry_points(&schema, &grammar) {
            let (status, reply) =
                common::post_json(&client, &format!("{base}{route}"), &body).await;
            assert_eq!(status, 400, "{route} {param}: {reply}");
            let message = reply["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("levels deep") || message.contains("bytes"),
                "{route} {param}: {message}"
            );
            assert_eq!(reply["error"]["type"], "invalid_request_error");
            assert!(still_serving(&client, &base).await, "after {route} {param}");
        }
    }
    // A schema within the bounds is still enforced.
    let (status, reply) = common::post_json(
        &client,
        &format!("{base}/v1/completions"),
        &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 40, "temperature": 0,
                "structured_outputs": {"json": ref_chain(8)}}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text}");
}

/// The largest gap between two events of a stream that runs until `until` resolves.
async fn longest_gap_while<F: std::future::Future>(
    client: &reqwest::Client,
    base: &str,
    until: F,
) -> (Duration, F::Output) {
    let resp = client
        .post(format!("{base}/v1/completions"))
        .json(
            &json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2000,
                      "ignore_eos": true, "stream": true, "temperature": 0}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut events = resp.bytes_stream();
    // The stream is under way before the hostile request starts.
    events.next().await.unwrap().unwrap();
    let mut last = Instant::now();
    let mut longest = Duration::ZERO;
    tokio::pin!(until);
    loop {
        tokio::select! {
            out = &mut until => {
                longest = longest.max(last.elapsed());
                return (longest, out);
            }
            chunk = events.next() => {
                assert!(chunk.is_some(), "the stream ended early");
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_schema_with_many_choices_does_not_freeze_other_streams() {
    let (_server, base) = start(&[]);
    let client = ready(&base).await;
    // About 145 KiB of schema; n = 16. It was compiled once per choice on the engine's
    // thread: every stream stopped for 26.5 s.
    let props: serde_json::Map<String, Value> = (0..600)
        .map(|i| {
            let values: Vec<String> = (0..20).map(|j| format!("value{i}_{j}")).collect();
            (format!("p{i}"), json!({"type": "string", "enum": values}))
        })
        .collect();
    let required: Vec<&String> = props.keys().collect();
    let schema = json!({"type": "object", "properties": props, "required": required});
    assert!(schema.to_string().len() > 140_000);
    let hostile = json!({"model": MODEL, "prompt": "x", "max_tokens": 3, "n": 16,
        "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}});
    let url = format!("{base}/v1/completions");
    let (gap, (status, reply)) =
        longest_gap_while(&client, &base, common::post_json(&client, &url, &hostile)).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"].as_array().map(Vec::len), Some(16));
    assert!(gap < Duration::from_secs(5), "the stream stalled {gap:?}");
    // A choice list of 100k strings: too large, refused at once.
    let choices: Vec<String> = (0..100_000).map(|i| format!("choice{i}")).collect();
    let hostile = json!({"model": MODEL, "prompt": "x", "max_tokens": 3, "n": 16,
                         "structured_outputs": {"choice": choices}});
    let (gap, (status, reply)) =
        longest_gap_while(&client, &base, common::post_json(&client, &url, &hostile)).await;
    assert_eq!(status, 400, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("bytes"));
    assert!(gap < Duration::from_secs(5), "the stream stalled {gap:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formats_the_engine_cannot_enforce_are_client_errors() {
    let (_server, base) = start(&[]);
    let client = ready(&base).await;
    let url = format!("{base}/v1/completions");
    let digits: Vec<String> = (0..10).map(|d| d.to_string()).collect();
    for (extra, param) in [
        // Compiles, but the grammar engine gives up on its first token.
        (json!({"guided_regex": "a{1000}{1000}"}), "guided_regex"),
        // Every token the format allows first is a bad word.
        (
            json!({"guided_regex": "[0-9]+", "bad_words": digits}),
            "guided_regex",
        ),
    ] {
        for stream in [false, true] {
            let mut body =
                json!({"model": MODEL, "prompt": "x", "max_tokens": 5, "stream": stream});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            let resp = client.post(&url).json(&body).send().await.unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            // A stream that had started reports it as an error event.
            let error: Value = match status {
                200 => {
                    let data = text
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: "))
                        .find(|d| d.contains("\"error\""))
                        .unwrap_or_else(|| panic!("no error event: {text}"));
                    serde_json::from_str(data).unwrap()
                }
                _ => serde_json::from_str(&text).unwrap(),
            };
            assert!(
                status == 400 || (stream && status == 200),
                "{status} {text}"
            );
            assert_eq!(error["error"]["type"], "invalid_request_error", "{text}");
            assert_eq!(error["error"]["param"], param, "{text}");
            assert!(!text.contains("may be retried"), "{text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megabytes_of_prompt_are_refused_without_exhausting_memory() {
    let (started, base) = start(&[]);
    let pid = started.server.0.id();
    let client = ready(&base).await;
    let before = memory_mib(pid, "VmRSS");
    // Eight prompts of 4 MB at once: each cost about 700 MB to tokenize.
    let prompt = "word ".repeat(800_000);
    let url = format!("{base}/v1/completions");
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1});
    let sends = (0..8).map(|_| common::post_json(&client, &url, &body));
    for (status, reply) in futures_util::future::join_all(sends).await {
        assert_eq!(status, 400, "{reply}");
        assert_eq!(reply["error"]["param"], "prompt");
        assert!(reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context length"));
    }
    // 100k messages: more than the context could ever hold.
    let messages: Vec<Value> = (0..100_000)
        .map(|_| json!({"role": "user", "content": "a"}))
        .collect();
    let (status, reply) = common::post_json(
        &client,
        &format!("{base}/v1/chat/completions"),
        &json!({"model": MODEL, "messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["param"], "messages");
    let peak = memory_mib(pid, "VmHWM");
    let after = memory_mib(pid, "VmRSS");
    // The bodies themselves (8 x 4 MB, parsed) are all that may be held at once.
    assert!(
        peak - before < 768.0,
        "peak {peak:.0} MiB from {before:.0} MiB"
    );
    assert!(
        after - before < 256.0,
        "after {after:.0} MiB from {before:.0} MiB"
    );
    assert!(still_serving(&client, &base).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_queued_or_prefilling_is_cancelled_at_once() {
    // One sequence at a time: a second request waits in the queue.
    let (_server, base) = start(&["--max-num-seqs", "1", "--max-model-len", "2048"]);
    let client = ready(&base).await;
    let running = || metric(&client, &base, "tessera_num_requests_running", "");
    let waiting = || metric(&client, &base, "tessera_num_requests_waiting", "");
    // A long generation holds the one place.
    let long = tokio::spawn({
        let (client, base) = (client.clone(), base.clone());
        async move {
            common::post_json(
                &client,
                &format!("{base}/v1/completions"),
                &json!({"model": MODEL, "prompt": "Count:", "max_tokens": 400,
                        "ignore_eos": true, "temperature": 0}),
            )
            .await
        }
    });
    assert!(eventually(Duration::from_secs(30), || async { running().await == 1.0 }).await);
    // Streamed and not, each queued behind it, then abandoned by its client.
    for stream in [true, false] {
        let body = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 10, "stream": stream})
            .to_string();
        let mut raw = send_raw(&base, format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()).as_bytes()).await;
        assert!(eventually(Duration::from_secs(10), || async { waiting().await == 1.0 }).await);
        raw.shutdown().await.unwrap();
        drop(raw);
        // A leak would keep it queued for good; on a loaded machine noticing the closed
        // connection may take a few seconds.
        assert!(
            eventually(Duration::from_secs(10), || async { waiting().await == 0.0 }).await,
            "the abandoned request (stream: {stream}) stayed queued"
        );
        assert_eq!(running().await, 1.0, "the long request still runs alone");
    }
    assert!(
        !long.is_finished(),
        "the test needs the long request still running"
    );
    long.abort();
    // A long prompt being prefilled (256 tokens a step on CPU), abandoned after its
    // first steps.
    assert!(eventually(Duration::from_secs(60), || async { running().await == 0.0 }).await);
    let steps_before = metric(&client, &base, "tessera_steps_total", "").await;
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(180);
    let body =
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 5, "stream": true}).to_string();
    let mut raw = send_raw(&base, format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()).as_bytes()).await;
    assert!(eventually(Duration::from_secs(10), || async { running().await == 1.0 }).await);
    raw.shutdown().await.unwrap();
    drop(raw);
    // How soon is counted in steps below, which machine load does not stretch.
    assert!(
        eventually(Duration::from_secs(10), || async {
            running().await == 0.0
                && metric(&client, &base, "tessera_kv_blocks_in_use", "").await == 0.0
        })
        .await,
        "the abandoned prefill went on"
    );
    // About 1800 prompt tokens need 8 steps of 256; it stopped before the end.
    let steps = metric(&client, &base, "tessera_steps_total", "").await - steps_before;
    assert!(steps < 7.0, "{steps} steps ran for a client that had left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_cut_within_the_stall_timeout() {
    let (_server, base) = start(&[
        "--stream-stall-timeout",
        "2",
        "--max-model-len",
        "4096",
        "--kv-cache-memory-mib",
        "256",
    ]);
    let client = ready(&base).await;
    // Each token is one SSE event of about 170 bytes: 3500 tokens are about 600 KB,
    // which the server's kernel send buffer (up to 4 MiB) held whole, so the stall was
    // never seen and the sequence kept its KV blocks to the end. This client's kernel
    // takes 64 KiB (a fixed receive buffer, as many clients and proxies have).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let mut raw = socket.connect(addr(&base).parse().unwrap()).await.unwrap();
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3500,
                      "ignore_eos": true, "stream": true, "temperature": 0})
    .to_string();
    raw.write_all(format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()).as_bytes()).await.unwrap();
    let running = || metric(&client, &base, "tessera_num_requests_running", "");
    assert!(eventually(Duration::from_secs(30), || async { running().await == 1.0 }).await);
    let cut = eventually(Duration::from_secs(120), || async {
        running().await == 0.0
            && metric(&client, &base, "tessera_kv_blocks_in_use", "").await == 0.0
    })
    .await;
    assert!(cut, "never cut");
    let generated = metric(&client, &base, "vllm:generation_tokens_total", "").await;
    assert!(
        generated < 2500.0,
        "{generated} tokens were generated for a client that read none"
    );
    drop(raw);
}
