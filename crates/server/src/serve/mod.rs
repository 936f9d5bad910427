//! `tessera serve`: load the model, start the engine loop, then serve the OpenAI API.
//!
//! Start-up order matters: the listener is bound only after the model is loaded, so a
//! client that can connect can be served. Shutdown (Ctrl-C or SIGTERM) closes
//! admission first so open streams end, then drains HTTP, then joins the engine loop.

pub mod auth;
pub mod chat_route;
pub mod completion_route;
pub mod error;
pub mod generation;
pub mod info_routes;
pub mod json_body;
pub mod router;
pub mod state;
pub mod stream;
pub mod tokenize_route;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use tessera_engine::{load_tokenizer, Engine};
use tessera_protocol::Executor;
use tessera_scheduler::{EngineLoop, SchedulerConfig};

use crate::api::valid_request::ValidationContext;
use crate::model_args::ModelArgs;
use crate::serve::state::{unix_now, AppState};

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Model name clients must send in `model` (default: the model file stem).
    #[arg(long)]
    pub served_model_name: Option<String>,

    /// Accepted API key (repeatable; comma-separated in TESSERA_API_KEY). Without
    /// one, no authentication.
    #[arg(
        long = "api-key",
        env = "TESSERA_API_KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,

    /// Origins allowed by CORS, comma-separated, or `*`. CORS is off by default.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,

    /// Most sequences running at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,

    /// Most tokens run through the model in one step.
    #[arg(long, default_value_t = 2048)]
    pub max_batch_tokens: usize,

    /// Most requests waiting to start; more are refused with 429.
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,

    /// Longest context (prompt + completion) in tokens (default: the model's).
    #[arg(long)]
    pub max_model_len: Option<usize>,

    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
}

/// Load the tokenizer and the model and start the engine loop.
pub fn load_state(args: &ServeArgs) -> Result<AppState> {
    let started = Instant::now();
    let cfg = args.model.engine_config()?;
    tracing::info!("[1/3] tokenizer: {}", cfg.model_path.display());
    let tokenizer = Arc::new(load_tokenizer(&cfg.model_path).context("loading the tokenizer")?);
    tracing::info!("[2/3] weights: {}", cfg.model_path.display());
    let engine = Engine::load(&cfg).context("loading the model")?;
    let max_model_len = args
        .max_model_len
        .unwrap_or_else(|| engine.max_context_tokens());
    let kv_capacity_tokens = engine.kv_cache_shape().capacity_tokens();
    let scheduler = EngineLoop::spawn(
        SchedulerConfig {
            block_size_tokens: cfg.block_size_tokens,
            max_batch_tokens: args.max_batch_tokens,
            max_num_seqs: args.max_num_seqs,
            max_waiting: args.max_waiting,
            max_model_len: args.max_model_len,
            enable_prefix_caching: true,
        },
        engine,
    )
    .context("starting the scheduler")?;
    let served_model_name = match &args.served_model_name {
        Some(name) => name.clone(),
        None => cfg
            .model_path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_string()),
    };
    tracing::info!(
        "[3/3] loaded `{served_model_name}` in {:.2}s (max_model_len {max_model_len})",
        started.elapsed().as_secs_f64()
    );
    Ok(AppState {
        scheduler,
        validation: Arc::new(ValidationContext {
            tokenizer,
            served_model_name,
            max_model_len,
            kv_capacity_tokens,
        }),
        api_keys: Arc::new(
            args.api_keys
                .iter()
                .filter(|k| !k.is_empty())
                .cloned()
                .collect(),
        ),
        max_body_bytes: args.max_body_bytes,
        started_unix: unix_now(),
    })
}

pub fn run(args: ServeArgs) -> Result<()> {
    let state = load_state(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tessera-http")
        .build()
        .context("starting the async runtime")?;
    let scheduler = state.scheduler.clone();
    runtime.block_on(serve(state, &args))?;
    scheduler
        .join()
        .map_err(|e| anyhow::anyhow!("engine loop: {e}"))?;
    Ok(())
}

async fn serve(state: AppState, args: &ServeArgs) -> Result<()> {
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| {
            format!(
                "--host {} --port {} is not an address",
                args.host, args.port
            )
        })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    if !args.api_keys.is_empty() {
        tracing::info!("API keys required ({} configured)", state.api_keys.len());
    }
    tracing::info!("listening on http://{local}");
    let scheduler = state.scheduler.clone();
    let app = router::build_router(state, &args.allowed_origins);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            tracing::info!("shutting down: refusing new requests, ending open streams");
            scheduler.shutdown();
        })
        .await
        .context("serving HTTP")
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
