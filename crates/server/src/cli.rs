//! The `tessera` command line: global options and subcommands.

use clap::{Parser, Subcommand, ValueEnum};

use crate::{chat_cmd, generate_cmd, serve};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "An OpenAI-compatible LLM server with tensor parallelism"
)]
pub struct Cli {
    /// Log line format: human-readable text, or one JSON object per line (with the
    /// request id of the current request in `span`/`spans`). Filter with RUST_LOG.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "TESSERA_LOG_FORMAT", help_heading = crate::help_headings::LOGGING)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

// Parsed once at start-up; boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the model over the OpenAI-compatible HTTP API (and a chat page at `/`).
    Serve(serve::ServeArgs),
    /// Chat in the terminal: with the model loaded here (the `serve` flags), or with a
    /// running server (--url).
    Chat(chat_cmd::ChatArgs),
    /// Generate a completion for one prompt and print it.
    Generate(generate_cmd::GenerateArgs),
    /// List the model families Tessera runs, with their config.json and GGUF names.
    Models,
}
