//! `tessera chat` as a person uses it: at a terminal (a pseudo-terminal here, so the
//! terminal echoes what is typed and turns line ends into CR LF), on the model loaded
//! in its own process. Two turns, `/reset`, a third turn, `/exit`. Each answer is
//! compared with what `/v1/chat/completions` of a separate `tessera serve` answers for
//! the conversation the chat should have sent: the second turn with the first in its
//! history, the one after `/reset` without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

const FRANCE: &str = "What is the capital of France? Answer in one sentence.";
const ITALY: &str = "And of Italy?";
const MAX_TOKENS: &str = "24";

/// A pseudo-terminal: `(controller, terminal)`.
fn pseudo_terminal() -> (OwnedFd, OwnedFd) {
    let (mut controller, mut terminal) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the two integers, which are then
    // owned here and nowhere else; the name, termios and winsize arguments may be null.
    let rc = unsafe {
        libc::openpty(
            &mut controller,
            &mut terminal,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and have no other owner.
    unsafe {
        (
            OwnedFd::from_raw_fd(controller),
            OwnedFd::from_raw_fd(terminal),
        )
    }
}

/// The greedy answer of the reference server to `messages`.
async fn reference(client: &reqwest::Client, base: &str, messages: Value) -> String {
    let body: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &json!({"model": "smollm2", "messages": messages, "temperature": 0,
                      "max_tokens": MAX_TOKENS.parse::<u32>().unwrap()}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"))
        .to_string()
}

/// What the terminal showed so far, with CR LF as LF.
struct Screen {
    bytes: mpsc::Receiver<Vec<u8>>,
    text: String,
}

impl Screen {
    /// Waits (at most 300 s, then fails) until the screen shows `prompts` prompts.
    fn wait_for_prompts(&mut self, prompts: usize) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while self.text.matches("> ").count() < prompts {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.bytes.recv_timeout(left) {
                Ok(chunk) => {
                    self.text
                        .push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n"));
                }
                Err(_) => panic!("no prompt {prompts} on the screen:\n{}", self.text),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_in_a_terminal_keeps_the_conversation_until_reset() {
    let server = common::start_serve(&[], &["--max-model-len", "1024"], &[]);
    let client = reqwest::Client::new();
    common::wait_ready(&client, &server.base, Duration::from_secs(300)).await;

    let (controller, terminal) = pseudo_terminal();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "chat",
            "--temperature",
            "0",
            "--max-tokens",
            MAX_TOKENS,
            "--max-model-len",
            "1024",
            "--kv-cache-memory-mib",
            "32",
            "--threads-per-rank",
            "1",
        ])
        .stdin(Stdio::from(terminal.try_clone().unwrap()))
        .stdout(Stdio::from(terminal))
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tessera chat");
    let mut keys = File::from(controller);
    let mut reader = keys.try_clone().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        // Ends with an error once the chat has exited and the terminal is closed.
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut screen = Screen {
        bytes: rx,
        text: String::new(),
    };
    let typed = [FRANCE, ITALY, "/reset", ITALY, "/exit"];
    for (i, line) in typed.iter().enumerate() {
        screen.wait_for_prompts(i + 1);
        keys.write_all(format!("{line}\n").as_bytes()).unwrap();
    }
    let status = child.wait().unwrap();
    let mut errors = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut errors)
        .unwrap();
    assert!(status.success(), "{status}: {errors}");
    assert!(errors.contains("(a new conversation)"), "{errors}");

    // "> QUESTION\nANSWER\n" per turn, as typed and echoed.
    let turns: Vec<&str> = screen.text.split("> ").skip(1).collect();
    let answer = |turn: usize, question: &str| -> String {
        let shown = turns.get(turn).unwrap_or_else(|| panic!("{}", screen.text));
        let rest = shown
            .strip_prefix(&format!("{question}\n"))
            .unwrap_or_else(|| panic!("turn {turn} is not {question:?}: {shown:?}"));
        rest.strip_suffix('\n').unwrap_or(rest).to_string()
    };
    let first = answer(0, FRANCE);
    assert_eq!(first, "The capital of France is Paris.");
    let with_history = reference(
        &client,
        &server.base,
        json!([{"role": "user", "content": FRANCE},
               {"role": "assistant", "content": first},
               {"role": "user", "content": ITALY}]),
    )
    .await;
    let alone = reference(
        &client,
        &server.base,
        json!([{"role": "user", "content": ITALY}]),
    )
    .await;
    assert_ne!(with_history, alone, "the history must change the answer");
    assert_eq!(answer(1, ITALY), with_history);
    assert_eq!(answer(3, ITALY), alone);
}
