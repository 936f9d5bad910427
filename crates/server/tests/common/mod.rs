//! The real `tessera` binary in integration tests: started on a free port, killed if the
//! test fails first, and its log lines (stderr and stdout) forwarded as they arrive.

// Each test binary uses its own part of this module.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod engine_loop;
pub mod hostile;
pub mod mock_hub;
pub mod reference;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Kills the server if the test fails before it exits.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A log line and when it arrived.
pub type Log = mpsc::Receiver<(Instant, String)>;

/// A server that has said where it listens.
pub struct Started {
    pub server: Server,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The lines logged up to and including the "listening on" line.
    pub early: Vec<String>,
    /// The lines logged after it, as they come.
    pub log: Log,
}

/// Forwards every line of `stream` to `tx` (and to the test's output).
fn forward(stream: impl Read + Send + 'static, tx: mpsc::Sender<(Instant, String)>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            eprintln!("[server] {line}");
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
}

/// Runs `tessera ARGS` with `env` added to the test's environment (add `--port 0` to
/// `args` for a free port), and returns once it logs where it listens (within 300 s).
pub fn start(args: &[&str], env: &[(&str, &str)]) -> Started {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command.args(args).envs(env.iter().copied());
    start_command(command)
}

/// Runs `command` (a `tessera` invocation) as [`start`] does.
pub fn start_command(mut command: Command) -> Started {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tessera");
    let (tx, log) = mpsc::channel();
    forward(child.stderr.take().unwrap(), tx.clone());
    forward(child.stdout.take().unwrap(), tx);
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut early = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, line) = log
            .recv_timeout(left)
            .expect("the server never said where it listens");
        let base = line
            .split("listening on ")
            .nth(1)
            .map(|rest| rest.split_whitespace().next().unwrap().to_string());
        early.push(line);
        if let Some(base) = base {
            return Started {
                server,
                base,
                early,
                log,
            };
        }
    }
}

/// Runs `tessera GLOBAL serve --port 0 --served-model-name smollm2
/// --kv-cache-memory-mib 32 --threads-per-rank 1 SERVE_ARGS` with `env`, as [`start`].
pub fn start_serve(global: &[&str], serve_args: &[&str], env: &[(&str, &str)]) -> Started {
    let common = [
        "serve",
        "--port",
        "0",
        "--served-model-name",
        "smollm2",
        "--kv-cache-memory-mib",
        "32",
        "--threads-per-rank",
        "1",
    ];
    let args: Vec<&str> = global
        .iter()
        .chain(&common)
        .chain(serve_args)
        .copied()
        .collect();
    start(&args, env)
}

/// Waits until `/readyz` answers 200, failing the test after `within`.
pub async fn wait_ready(client: &reqwest::Client, base: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let ready = client.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// POSTs `body` as JSON; the status and the JSON reply.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let resp = client.post(url).json(body).send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("json body"))
}

/// The concatenated content deltas and the finish reason of each choice of a stream.
pub async fn post_stream(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Vec<(String, String)> {
    let resp = client.post(url).json(body).send().await.expect("request");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("stream");
    let mut choices: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: serde_json::Value = serde_json::from_str(data).expect("chunk JSON");
        for c in chunk["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            if choices.len() <= i {
                choices.resize(i + 1, Default::default());
            }
            let piece = c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .unwrap_or("");
            choices[i].0.push_str(piece);
            if let Some(reason) = c["finish_reason"].as_str() {
                choices[i].1 = reason.to_string();
            }
        }
    }
    choices
}

/// A chat template in a folder of its own, removed when this is dropped.
pub struct TemplateFile(pub std::path::PathBuf);

impl Drop for TemplateFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `tessera serve` (as [`start_serve`]) with `--chat-template` set to `source`, written
/// to a file named `name`; keep the file until the server is done.
pub fn start_with_template(name: &str, source: &str) -> (Started, TemplateFile) {
    let dir = std::env::temp_dir().join(format!("tessera-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("template folder");
    let file = TemplateFile(dir.join(format!("{name}.jinja")));
    std::fs::write(&file.0, source).expect("template file");
    let path = file.0.to_str().expect("a UTF-8 path").to_string();
    (start_serve(&[], &["--chat-template", &path], &[]), file)
}
