//! `tessera`: serve a model over the OpenAI API, or generate from the command line.

use clap::{CommandFactory, FromArgMatches};
use tessera_server::cli::{Cli, Command, LogFormat};
use tessera_server::{config_layers, generate_cmd, serve, template_sandbox};

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
    if let Command::Serve(args) = &cli.command {
        if args.print_config {
            let cmd = Cli::command();
            if let (Some(serve), Some(m)) = (
                cmd.find_subcommand("serve"),
                matches.subcommand_matches("serve"),
            ) {
                print!("{}", config_layers::render(serve, m));
            }
            return std::process::ExitCode::SUCCESS;
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
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
    let result = match cli.command {
        Command::Generate(mut args) => {
            args.model.template_sandbox = Some(template_sandbox::launcher());
            generate_cmd::run(args)
        }
        Command::Serve(mut args) => {
            args.model.template_sandbox = Some(template_sandbox::launcher());
            serve::run(args)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<serve::EngineFailure>().is_some() {
                std::process::ExitCode::from(serve::ENGINE_FAILED_EXIT_CODE)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}
