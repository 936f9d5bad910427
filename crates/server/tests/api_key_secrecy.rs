//! API keys stay secret: the real `tessera serve` with one key from the environment and
//! one from `--api-key-file`, logging at debug level, answers right keys, refuses wrong
//! ones, and no key (right or wrong) appears anywhere in its logs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{json, Value};

mod common;

const ENV_KEY: &str = "sk-env-5f1d0c7e9a";
const FILE_KEY: &str = "sk-file-83b2aa41c6";
const WRONG_KEY: &str = "sk-wrong-77e01d9b52";

#[tokio::test]
async fn keys_work_and_never_reach_the_logs() {
    let dir = std::env::temp_dir().join(format!("tessera-keys-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("api-keys");
    std::fs::write(&key_file, format!("# test key\n{FILE_KEY}\n")).unwrap();
    let started = common::start_serve(
        &[],
        &[
            "--max-model-len",
            "256",
            "--api-key-file",
            key_file.to_str().unwrap(),
        ],
        &[("TESSERA_API_KEY", ENV_KEY), ("RUST_LOG", "debug")],
    );
    let base = started.base;
    let client = reqwest::Client::new();
    common::wait_ready(&client, &base, Duration::from_secs(120)).await;

    for key in [ENV_KEY, FILE_KEY] {
        let r = client
            .get(format!("{base}/v1/models"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(FILE_KEY)
        .json(&json!({"model": "smollm2", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for auth in [
        format!("Bearer {WRONG_KEY}"),
        format!("Bearer {ENV_KEY}x"),
        format!("Basic {FILE_KEY}"),
        WRONG_KEY.to_string(),
    ] {
        let r = client
            .get(format!("{base}/v1/models"))
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key");
        let text = body.to_string();
        assert!(
            !text.contains(ENV_KEY) && !text.contains(FILE_KEY),
            "{text}"
        );
    }
    // Let the last log lines arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lines = started.early;
    lines.extend(started.log.try_iter().map(|(_, line)| line));
    let logs = lines.join("\n");
    assert!(logs.contains("API keys required (2 configured)"), "{logs}");
    assert!(logs.contains("status=401"), "requests were logged: {logs}");
    for secret in [ENV_KEY, FILE_KEY, WRONG_KEY, "sk-env", "sk-file"] {
        assert!(!logs.contains(secret), "`{secret}` is in the logs");
    }
}
