//! `tessera generate`: one prompt, printed as it is generated.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use tessera_engine::{check_vocabulary, generate, Engine, GenerateOptions};
use tessera_protocol::SamplingParams;
use tessera_tokenizer::{ChatMessage, ChatRenderRequest, IncrementalDecoder};

use crate::model_args::ModelArgs;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// The prompt text, or `-` to read it from standard input.
    #[arg(long)]
    pub prompt: String,

    /// Treat the prompt as one user message rendered with the model's chat template.
    #[arg(long)]
    pub chat: bool,

    /// Tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,

    /// 0 is greedy.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,

    #[arg(long, default_value_t = 0)]
    pub top_k: usize,

    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,

    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,

    /// Seed of the sampler: the same seed gives the same text.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// A line of progress: plain on standard error, or a log line when logs are JSON.
fn progress(json_logs: bool, line: &str) {
    if json_logs {
        tracing::info!("{line}");
    } else {
        eprintln!("{line}");
    }
}

pub fn run(mut args: GenerateArgs, json_logs: bool) -> Result<()> {
    if args.prompt == "-" {
        let mut prompt = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut prompt)
            .context("reading the prompt from standard input")?;
        // A shell's `echo` or a file's last line adds one newline that is not the prompt's.
        if prompt.ends_with('\n') {
            prompt.pop();
        }
        args.prompt = prompt;
    }
    let started = Instant::now();
    let cfg = args.model.engine_config()?;
    progress(
        json_logs,
        &format!("[1/3] weights: {}", cfg.model_path.display()),
    );
    let mut engine = Engine::load(&cfg)?;
    if engine.is_worker_node() {
        // In a group of nodes the leader generates; this node runs its steps.
        return engine.serve_leader().map_err(Into::into);
    }
    progress(json_logs, "[2/3] tokenizer");
    let tokenizer = Arc::new(args.model.load_tokenizer()?);
    check_vocabulary(&tokenizer, engine.model_config())?;
    let text = if args.chat {
        let template = tokenizer.chat_template().context(
            "--chat needs a chat template, and the model has none: give one with \
                 --chat-template FILE",
        )?;
        template.render(&ChatRenderRequest {
            messages: vec![ChatMessage::new("user", &args.prompt)],
            add_generation_prompt: true,
            tools: None,
            kwargs: Default::default(),
        })?
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text, true)?;
    progress(
        json_logs,
        &format!(
            "[3/3] loaded in {:.2}s; generating from {} prompt tokens",
            started.elapsed().as_secs_f64(),
            prompt.len()
        ),
    );
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        seed: args.seed,
        ..SamplingParams::default()
    };
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling,
        stop_token_ids: tokenizer.eos_token_ids().to_vec(),
        prefill_chunk: 0,
    };
    let mut decoder = IncrementalDecoder::new(tokenizer.clone(), true);
    let mut stdout = std::io::stdout().lock();
    let gen_started = Instant::now();
    let mut failure = None;
    let tokens = generate(&mut engine, &prompt, &opts, |tok| {
        if failure.is_some() {
            return;
        }
        match decoder.push(tok) {
            Ok(piece) => {
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
            Err(e) => failure = Some(e),
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    let tail = decoder.finish()?;
    writeln!(stdout, "{tail}")?;
    let secs = gen_started.elapsed().as_secs_f64();
    progress(
        json_logs,
        &format!(
            "{} tokens in {secs:.2}s ({:.1} tok/s)",
            tokens.len(),
            tokens.len() as f64 / secs.max(1e-9)
        ),
    );
    Ok(())
}
