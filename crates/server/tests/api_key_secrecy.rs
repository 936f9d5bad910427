//! API keys stay secret: the real `tessera serve` with one key from the environment and
//! one from `--api-key-file`, logging at debug level, answers right keys, refuses wrong
//! ones, and no key (right or wrong) appears anywhere in its logs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const ENV_KEY: &str = "sk-env-5f1d0c7e9a";
const FILE_KEY: &str = "sk-file-83b2aa41c6";
const WRONG_KEY: &str = "sk-wrong-77e01d9b52";

#[tokio::test]
async fn keys_work_and_never_reach_the_logs() {
    let dir = std::env::temp_dir().join(format!("tessera-keys-it-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("api-keys");
    std::fs::write(&key_file, format!("# test key\n{FILE_KEY}\n")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "serve",
            "--port",
            "0",
            "--served-model-name",
            "smollm2",
            "--kv-cache-memory-mib",
            "32",
            "--max-model-len",
            "256",
            "--threads-per-rank",
            "1",
        ])
        .arg("--api-key-file")
        .arg(&key_file)
        .env("TESSERA_API_KEY", ENV_KEY)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tessera serve");
    let logs = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let _server = Server(child);
    {
        let err_logs = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let logs = &err_logs;
                logs.lock().unwrap().push_str(&line);
                logs.lock().unwrap().push('\n');
                let _ = tx.send(line);
            }
        });
        let out_logs = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let logs = &out_logs;
                logs.lock().unwrap().push_str(&line);
                logs.lock().unwrap().push('\n');
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let base = loop {
        assert!(Instant::now() < deadline, "the server never listened");
        let line = rx.recv_timeout(Duration::from_secs(120)).unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let client = reqwest::Client::new();
    while Instant::now() < deadline {
        let ready = client.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

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
    let logs = logs.lock().unwrap().clone();
    assert!(logs.contains("API keys required (2 configured)"), "{logs}");
    assert!(logs.contains("status=401"), "requests were logged: {logs}");
    for secret in [ENV_KEY, FILE_KEY, WRONG_KEY, "sk-env", "sk-file"] {
        assert!(!logs.contains(secret), "`{secret}` is in the logs");
    }
}
