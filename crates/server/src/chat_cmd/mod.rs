//! `tessera chat`: a conversation in the terminal. It loads the model here (with every
//! `serve` flag, on a server of its own bound to a free loopback port) or talks to a
//! running server (`--url`, `--api-key`), streams each answer as it is generated, and
//! keeps the conversation until `/reset`. `/system TEXT` sets the system message,
//! `/exit` (or Ctrl-D, or Ctrl-C at the prompt) leaves; Ctrl-C during an answer stops
//! that answer.
//!
//! Both ways go through the OpenAI route `/v1/chat/completions`, so the chat sees what
//! any client sees: the chat template, stop rules, limits and errors of the server.

pub mod client;
pub mod conversation;
pub mod sse;

use std::io::Write;
use std::net::SocketAddr;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use tokio::sync::mpsc;

use crate::chat_cmd::client::{ChatClient, Piece, TurnSettings};
use crate::chat_cmd::conversation::{Conversation, Input, COMMANDS};
use crate::help_headings::{CHAT, SAMPLING};
use crate::serve::{self, Embedded, ServeArgs};

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// A running server to talk to (its base URL, e.g. http://localhost:8000); without
    /// it the model is loaded here, with the flags `tessera serve` takes.
    #[arg(long, help_heading = CHAT)]
    pub url: Option<String>,

    /// The system message to start with (`/system TEXT` changes it).
    #[arg(long, help_heading = CHAT)]
    pub system: Option<String>,

    /// Most tokens per answer (default: the server's, the rest of the context).
    #[arg(long, help_heading = SAMPLING)]
    pub max_tokens: Option<usize>,

    /// Sampling temperature, 0 for greedy (default: the server's, 1).
    #[arg(long, help_heading = SAMPLING)]
    pub temperature: Option<f32>,

    /// Seed of the sampler: the same seed and conversation give the same answer.
    #[arg(long, help_heading = SAMPLING)]
    pub seed: Option<u64>,

    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The flags that mean something with `--url` (the rest load a model here).
pub const REMOTE_FLAGS: &[&str] = &[
    "url",
    "system",
    "max_tokens",
    "temperature",
    "seed",
    "api_keys",
    "log_format",
];

pub fn run(args: ChatArgs) -> Result<()> {
    let settings = TurnSettings {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        seed: args.seed,
    };
    let conversation = Conversation::new(args.system.clone());
    let api_key = args.serve.api_keys.first().cloned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if let Some(url) = &args.url {
        let client = ChatClient::new(url, api_key)?;
        return runtime.block_on(chat_loop(client, conversation, settings));
    }
    let mut serve_args = args.serve;
    // A port of its own, unless one is asked for: a server may already hold 8000.
    serve_args.port.get_or_insert(0);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<SocketAddr>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let name = serve_args
        .model
        .default_served_name()
        .unwrap_or_else(|_| "the default model".to_string());
    eprintln!("loading {name} ...");
    let server = std::thread::Builder::new()
        .name("tessera-chat-server".into())
        .spawn(move || {
            serve::run_embedded(
                serve_args,
                Embedded {
                    ready: ready_tx,
                    stop: stop_rx,
                },
            )
        })
        .context("starting the server thread")?;
    let Ok(addr) = runtime.block_on(ready_rx) else {
        // The server stopped before it was ready: its error says why.
        return match server.join() {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => Err(anyhow!("the model server stopped before it was ready")),
            Err(_) => Err(anyhow!("the model server panicked")),
        };
    };
    let client = ChatClient::new(&format!("http://{addr}"), api_key)?;
    let result = runtime.block_on(chat_loop(client, conversation, settings));
    let _ = stop_tx.send(());
    match server.join() {
        Ok(stopped) => result.and(stopped),
        Err(_) => result.and(Err(anyhow!("the model server panicked"))),
    }
}

/// Lines of standard input, read on a thread of their own (a blocking read would hold
/// the runtime); the channel closes at end of input.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(4);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        loop {
            let mut line = String::new();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if tx.blocking_send(line).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

async fn chat_loop(
    client: ChatClient,
    mut conversation: Conversation,
    settings: TurnSettings,
) -> Result<()> {
    let model = client.model().await?;
    eprintln!("chatting with {model} at {} ({COMMANDS})", client.base());
    let mut lines = stdin_lines();
    loop {
        print("> ");
        let line = tokio::select! {
            line = lines.recv() => line,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(line) = line else {
            print("\n");
            return Ok(());
        };
        match Input::parse(&line) {
            Input::Empty => {}
            Input::Exit => return Ok(()),
            Input::Reset => {
                conversation.reset();
                eprintln!("(a new conversation)");
            }
            Input::System(text) => {
                let cleared = text.is_empty();
                conversation.set_system(text);
                eprintln!(
                    "{}",
                    if cleared {
                        "(no system message)"
                    } else {
                        "(system message set)"
                    }
                );
            }
            Input::Help(unknown) => {
                if let Some(command) = unknown {
                    eprintln!("unknown command {command}");
                }
                eprintln!("{COMMANDS}");
            }
            Input::Message(text) => {
                conversation.push_user(text);
                let mut thinking = false;
                let answer =
                    client.answer(
                        &model,
                        conversation.messages(),
                        &settings,
                        |piece| match piece {
                            Piece::Reasoning(r) => {
                                if !thinking {
                                    print("(thinking) ");
                                    thinking = true;
                                }
                                print(&r);
                            }
                            Piece::Content(c) => {
                                if thinking {
                                    print("\n\n");
                                    thinking = false;
                                }
                                print(&c);
                            }
                        },
                    );
                let answer = tokio::select! {
                    answer = answer => answer.map(Some),
                    _ = tokio::signal::ctrl_c() => Ok(None),
                };
                match answer {
                    Ok(Some(text)) => {
                        print("\n");
                        conversation.push_assistant(text);
                    }
                    Ok(None) => {
                        // What was shown of a stopped answer is not kept: the next turn
                        // starts from the question alone.
                        print("\n");
                        eprintln!("(stopped)");
                        conversation.pop_user();
                    }
                    Err(e) => {
                        print("\n");
                        eprintln!("error: {e:#}");
                        conversation.pop_user();
                    }
                }
            }
        }
    }
}
