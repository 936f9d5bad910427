//! `tessera`: serve a model over the OpenAI API, chat with it in the terminal, or
//! generate from the command line.

use clap::{ArgMatches, CommandFactory, FromArgMatches};
use tessera_server::cli::{Cli, Command, LogFormat};
use tessera_server::{chat_cmd, config_layers, generate_cmd, models_cmd, serve, template_sandbox};

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if template_sandbox::is_sandbox_invocation(&args) {
        return std::process::ExitCode::from(template_sandbox::run_sandbox());
    }
    let argv = match config_layers::layered_argv(&Cli::command(), args, |k| std::env::var(k).ok()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let matches = Cli::command().get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let print_config = match &cli.command {
        Command::Serve(args) if args.print_config => Some(("serve", args)),
        Command::Chat(chat) if chat.serve.print_config => Some(("chat", &chat.serve)),
        _ => None,
    };
    if let Some((name, args)) = print_config {
        let cmd = Cli::command();
        if let (Some(serve), Some(m)) = (
            cmd.find_subcommand("serve"),
            matches.subcommand_matches(name),
        ) {
            let derived = args.derived_defaults();
            print!("{}", config_layers::render(&cmd, serve, m, &derived));
        }
        return std::process::ExitCode::SUCCESS;
    }
    if let Command::Chat(chat) = &cli.command {
        if chat.url.is_some() {
            if let Some(flag) = matches.subcommand_matches("chat").and_then(local_flag) {
                eprintln!(
                    "error: --{flag} is for a model loaded here; with --url the server there \
                     answers with its own model and settings"
                );
                return std::process::ExitCode::from(2);
            }
        }
    }
    // A chat in the terminal shows warnings only, unless RUST_LOG asks for more.
    let default_filter = match cli.command {
        Command::Chat(_) => "warn",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colours only for a person at a terminal, not in container logs.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    // Chat templates come with model files: the binary renders them in sandboxes.
    let json = cli.log_format == LogFormat::Json;
    let result = match cli.command {
        Command::Generate(mut args) => {
            args.model.template_sandbox = Some(template_sandbox::launcher());
            args.model.json_logs = json;
            generate_cmd::run(args, json)
        }
        Command::Serve(mut args) => {
            args.model.template_sandbox = Some(template_sandbox::launcher());
            args.model.json_logs = json;
            serve::run(args)
        }
        Command::Chat(mut args) => {
            args.serve.model.template_sandbox = Some(template_sandbox::launcher());
            args.serve.model.json_logs = json;
            chat_cmd::run(args)
        }
        Command::Models => models_cmd::run(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if json {
                tracing::error!("{e:#}");
            } else {
                eprintln!("error: {e:#}");
            }
            if e.downcast_ref::<serve::EngineFailure>().is_some() {
                std::process::ExitCode::from(serve::ENGINE_FAILED_EXIT_CODE)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// A flag typed for `chat` that only a local model uses, if any.
fn local_flag(chat: &ArgMatches) -> Option<String> {
    let cmd = Cli::command();
    let chat_cmd = cmd.find_subcommand("chat")?;
    chat.ids()
        .map(|id| id.as_str())
        .filter(|id| !chat_cmd::REMOTE_FLAGS.contains(id))
        .find(|id| chat.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| {
            chat_cmd
                .get_arguments()
                .find(|a| a.get_id().as_str() == id)
                .and_then(|a| a.get_long())
                .unwrap_or(id)
                .to_string()
        })
}
