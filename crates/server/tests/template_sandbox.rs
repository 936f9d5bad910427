//! A chat template that allocates without bound, served by the real binary: the request
//! that sets it off gets a 400 in the OpenAI error envelope, the server's own memory never
//! holds the string (the render ran in a sandbox process), and the next request is served.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{json, Value};

mod common;

/// ChatML, except that a message saying `grow` first doubles a string 32 times (4 GiB).
const GROWING: &str = "{% for m in messages %}{% if m.content == 'grow' %}\
{% set ns = namespace(s='x') %}{% for i in range(32) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\
{{ ns.s | length }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The most memory the process has held, from /proc.
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/PID/status");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

async fn chat(client: &reqwest::Client, base: &str, text: &str) -> (u16, Value) {
    let resp = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 4,
            "temperature": 0,
        }))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_grows_without_bound_fails_its_request_only() {
    let dir = std::env::temp_dir().join(format!("tessera-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let template = dir.join("growing.jinja");
    std::fs::write(&template, GROWING).unwrap();
    let started = common::start_serve(
        &[],
        &["--chat-template", template.to_str().unwrap()],
        &[("RUST_LOG", "info")],
    );
    let client = reqwest::Client::new();
    common::wait_ready(&client, &started.base, Duration::from_secs(120)).await;
    let pid = started.server.0.id();

    let (status, body) = chat(&client, &started.base, "grow").await;
    assert_eq!(status, 400, "{body}");
    let error = &body["error"];
    assert_eq!(error["type"], "invalid_request_error", "{body}");
    assert_eq!(error["param"], "messages", "{body}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("the chat template failed") && message.contains("512 MiB memory limit"),
        "{message}"
    );

    // The server carries on, with the same template, for every other conversation.
    for _ in 0..2 {
        let (status, body) = chat(&client, &started.base, "Say hello.").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 4, "{body}");
        assert!(!body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty());
    }
    // The growing string lived in the sandbox: the server's own peak stayed far below it.
    let peak = peak_rss_bytes(pid);
    assert!(peak < 2 << 30, "the server's peak RSS was {peak} bytes");
    let _ = std::fs::remove_dir_all(&dir);
}
