//! `tessera`: serve a model over the OpenAI API, or generate from the command line.

mod api;
mod generate_cmd;
mod model_args;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "An OpenAI-compatible LLM server with tensor parallelism"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a completion for one prompt and print it.
    Generate(generate_cmd::GenerateArgs),
    /// Serve the model over the OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Generate(args) => generate_cmd::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
