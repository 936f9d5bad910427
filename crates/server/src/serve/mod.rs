//! `tessera serve`: bind, load the model, warm it up, serve the OpenAI API, drain.
//!
//! Start-up: the port is bound first so orchestrators can probe a loading server
//! (`/livez` 200, `/startupz` and `/readyz` 503, every API route 503 `model_loading`);
//! the model loads on the blocking pool, a warm-up generation runs through the real
//! scheduler, and only then does the API router take over and, after it, readiness turn
//! true.
//!
//! Shutdown (SIGTERM or Ctrl-C): readiness turns false and admission closes (new
//! generations get 503 `shutting_down`) while the listener keeps answering probes and
//! metrics; running sequences get up to `--shutdown-timeout` seconds to finish; the
//! rest are aborted (their streams end with a `shutting_down` error event); then HTTP
//! drains and the engine loop is joined. A clean drain exits 0.
//!
//! Failures stay as small as their cause. A request whose own input the engine cannot
//! run is refused at validation (400); a rank that errors or panics in a step fails that
//! step's requests only (500 `generation_failed`), and the engine serves on. Engine
//! failure (a rank's device failed, or a rank hung past `--step-timeout`): the engine
//! cannot run another step, so the process does not try. In-flight requests end
//! with a 503 `engine_failed` error (streams: an error event, then `[DONE]`), `/readyz`
//! and `/livez` answer 503 `engine_failed` and new requests 503 at once; after
//! [`ENGINE_FAILED_LINGER`] (and until those responses are written, at most
//! [`HTTP_DRAIN_LIMIT`] more) the process exits with [`ENGINE_FAILED_EXIT_CODE`] so the
//! orchestrator restarts it.

pub mod api_keys;
mod args;
pub mod connection;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod fault_injection;
pub mod generation;
pub mod json_body;
pub mod lifecycle;
pub mod limits;
pub mod metrics;
pub mod middleware;
pub mod routes;
pub mod served_engine;
pub mod state;
pub mod stream;
pub mod windowed;
mod worker_node;

#[cfg(test)]
mod tests;

pub use args::{default_max_batch_tokens, ServeArgs, DEFAULT_PORT};

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tessera_engine::cluster::NodeLoss;
use tessera_engine::{check_vocabulary, GrammarCompiler};
use tessera_protocol::{Executor, GenerationRequest, SamplingParams, StopCondition, TokenEvent};
use tessera_scheduler::{
    EngineLoop, ExecutorLossNotifier, SchedulerConfig, SchedulerError, SchedulerHandle,
};

use crate::api::models::ServedNames;
use crate::api::params::grammar::GrammarService;
use crate::api::valid_request::ValidationContext;
use crate::runner::Runner;
use crate::serve::connection::{fit_connections_to_open_files, ConnHandle, LimitedListener};
use crate::serve::lifecycle::Lifecycle;
use crate::serve::metrics::ServerMetrics;
use crate::serve::middleware::Front;
use crate::serve::served_engine::ServedEngine;
use crate::serve::state::{unix_now, AppState};

/// Exit status of `tessera serve` after the engine failed (a device rank errored,
/// panicked or hung): 75, `EX_TEMPFAIL`, a failure a restart may clear. Other failures
/// exit 1, a clean shutdown 0.
pub const ENGINE_FAILED_EXIT_CODE: u8 = 75;

/// `serve` ends with this error when the engine failed; `main` turns it into
/// [`ENGINE_FAILED_EXIT_CODE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}; exiting so that the orchestrator restarts the server")]
pub struct EngineFailure(pub &'static str);

/// How long the server keeps answering (probes 503, new requests 503) after the engine
/// failed, so in-flight responses are written and load balancers see it not ready.
pub const ENGINE_FAILED_LINGER: Duration = Duration::from_secs(1);

/// How often the server checks whether the engine loop stopped by itself.
const ENGINE_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Start the engine loop over `engine` (armed with a fault when the test hook asks).
fn spawn_loop(
    args: &ServeArgs,
    config: SchedulerConfig,
    engine: ServedEngine,
) -> Result<SchedulerHandle, SchedulerError> {
    #[cfg(feature = "fault-injection")]
    if let Some(spec) = args.inject_fault {
        tracing::warn!("fault injection armed: {spec:?}");
        return EngineLoop::spawn(config, fault_injection::FaultyEngine::new(engine, spec));
    }
    let _ = args;
    EngineLoop::spawn(config, engine)
}

/// On the leader of a group of nodes: a worker node lost between steps fails the engine
/// loop at once (the server then exits 75, as after a failed step), not at the next
/// request. The thread ends with the engine.
fn watch_nodes(node_loss: NodeLoss, loop_: ExecutorLossNotifier) -> Result<()> {
    std::thread::Builder::new()
        .name("tessera-node-watch".into())
        .spawn(move || {
            if let Some(why) = node_loss.wait() {
                loop_.executor_lost(why);
            }
        })
        .context("starting the node watch")?;
    Ok(())
}

/// The layers in front of every route, from the flags: ready before the model loads.
pub fn front_of(args: &ServeArgs) -> Result<Front> {
    // A bad speculation config is refused before the model loads.
    crate::speculation_args::speculation(args.speculative_config.as_deref())?;
    Ok(Front {
        metrics: Arc::new(ServerMetrics::default()),
        limits: args.server_limits(),
        api_keys: Arc::new(api_keys::collect(
            &args.api_keys,
            args.api_key_file.as_deref(),
        )?),
        max_body_bytes: args.max_body_bytes,
    })
}

/// Load the tokenizer and the model and start the engine loop. `lifecycle` moves to
/// "warming up"; [`warm_up`] finishes start-up.
pub fn load_state(args: &ServeArgs, lifecycle: Arc<Lifecycle>, front: &Front) -> Result<AppState> {
    let started = Instant::now();
    let mut cfg = args.model.engine_config()?;
    cfg.max_model_len = args.max_model_len;
    // The engine measures GPU activations with a step as large as the scheduler's.
    cfg.max_batch_tokens = args
        .max_batch_tokens
        .unwrap_or_else(|| default_max_batch_tokens(&cfg.devices));
    cfg.max_num_seqs = args.max_num_seqs;
    let tokenizer_path = args.model.tokenizer_path()?;
    tracing::info!("[1/3] tokenizer: {}", tokenizer_path.display());
    let tokenizer = Arc::new(args.model.load_tokenizer()?);
    tracing::info!("[2/3] weights: {}", cfg.model_path.display());
    let speculation = crate::speculation_args::speculation(args.speculative_config.as_deref())?;
    let draft = speculation.as_ref().and_then(|s| s.draft_model.as_deref());
    cfg.mtp = speculation.as_ref().is_some_and(|s| s.mtp);
    let mut engine = ServedEngine::load(&cfg, draft, &tokenizer)?;
    let model_config = engine.target().model_config().clone();
    check_vocabulary(&tokenizer, &model_config).context("checking the tokenizer")?;
    let vocab_rows = model_config.vocab_size;
    let runner = Runner::resolve(
        args.runner,
        args.pooling,
        args.embedding_normalize,
        &cfg.model_path,
        model_config.hidden_size,
    )
    .context("choosing the pooling")?;
    let grammar = GrammarCompiler::new(&tokenizer, model_config.vocab_size);
    if let Err(e) = &grammar {
        tracing::warn!("response_format json_object/json_schema will be refused: {e}");
    }
    let max_model_len = args
        .max_model_len
        .unwrap_or_else(|| engine.max_context_tokens());
    let max_batch_tokens = args
        .max_batch_tokens
        .unwrap_or_else(|| default_max_batch_tokens(&cfg.devices));
    let kv_sequence_tokens = engine
        .kv_cache_shape()
        .max_sequence_tokens(max_batch_tokens);
    if let Some(warning) = kv_cache_shortfall(kv_sequence_tokens, max_model_len) {
        tracing::warn!("{warning}");
    }
    let engine_stats = engine.target().stats();
    let node_loss = engine.target_mut().take_node_loss();
    let scheduler = spawn_loop(
        args,
        SchedulerConfig {
            block_size_tokens: cfg.block_size_tokens,
            max_batch_tokens,
            max_num_seqs: args.max_num_seqs,
            max_waiting: args.max_waiting,
            max_model_len: args.max_model_len,
            enable_prefix_caching: true,
            speculation: speculation.map(|s| s.speculation),
            ..SchedulerConfig::default()
        },
        engine,
    )
    .context("starting the scheduler")?;
    if let Some(node_loss) = node_loss {
        watch_nodes(node_loss, scheduler.loss_notifier())?;
    }
    let served_model_names =
        ServedNames::new(&args.served_model_name, args.model.default_served_name()?);
    tracing::info!(
        "[3/3] loaded {} in {:.2}s (max_model_len {max_model_len})",
        served_model_names.listing(),
        started.elapsed().as_secs_f64()
    );
    lifecycle.set_loaded(scheduler.clone());
    Ok(AppState {
        scheduler,
        validation: Arc::new(ValidationContext {
            tokenizer,
            served_model_names,
            max_model_len,
            kv_sequence_tokens,
            vocab_rows,
            limits: args.request_limits(),
            grammar: GrammarService::new(grammar.map_err(|e| e.to_string()), args.grammar_limits()),
            tool_parser: args.tool_call_parser,
            reasoning: args.reasoning_parser,
            work_slots: Default::default(),
        }),
        api_keys: Arc::clone(&front.api_keys),
        max_body_bytes: front.max_body_bytes,
        limits: front.limits,
        started_unix: unix_now(),
        lifecycle,
        metrics: Arc::clone(&front.metrics),
        engine_stats: Some(engine_stats),
        ui: !args.no_ui,
        runner: Arc::new(runner),
    })
}

/// Tokens the warm-up generation asks for.
const WARM_UP_TOKENS: usize = 4;

/// Run a short greedy generation through the real scheduler (first-touch allocations,
/// thread pools, caches). Blocking. The caller marks the server started once its API
/// routes are in place.
pub fn warm_up(state: &AppState) -> Result<()> {
    let started = Instant::now();
    let prompt_ids = state
        .validation
        .tokenizer
        .encode("Hello", true)
        .context("tokenizing the warm-up prompt")?;
    let request = GenerationRequest {
        prompt_ids,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop: StopCondition {
            max_tokens: WARM_UP_TOKENS,
            stop_token_ids: Vec::new(),
            ignore_eos: true,
            request_stop_token_ids: Vec::new(),
        },
        cache_salt: None,
    };
    let (_, mut events) = state
        .scheduler
        .submit(request)
        .map_err(|e| anyhow::anyhow!("warm-up refused: {e}"))?;
    let mut tokens = 0usize;
    loop {
        match events.blocking_recv() {
            Some(TokenEvent::Token { .. }) => tokens += 1,
            Some(TokenEvent::Embedding(_)) => anyhow::bail!("warm-up came back as an embedding"),
            Some(TokenEvent::Finished { .. }) => break,
            Some(TokenEvent::Error(e) | TokenEvent::Failed(e) | TokenEvent::Refused(e)) => {
                anyhow::bail!("warm-up generation failed: {e}")
            }
            None => anyhow::bail!("warm-up generation ended without finishing"),
        }
    }
    // The warm-up is not traffic: the token, prefix-cache and queue-time metrics start
    // from zero.
    state.scheduler.clear_traffic_counters();
    tracing::info!(
        "warm-up: {tokens} tokens in {:.3}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The start-up warning for a KV cache that holds fewer tokens than one sequence may
/// use: requests longer than the cache are refused even though the context allows them.
fn kv_cache_shortfall(kv_sequence_tokens: usize, max_model_len: usize) -> Option<String> {
    (kv_sequence_tokens < max_model_len).then(|| {
        format!(
            "the KV cache holds {kv_sequence_tokens} tokens, fewer than max_model_len \
             {max_model_len}: longer requests will be refused; give more memory with \
             --kv-cache-memory-mib, or a shorter context with --max-model-len"
        )
    })
}

pub fn run(args: ServeArgs) -> Result<()> {
    run_with(args, None)
}

/// How a server that another command starts (`tessera chat` on a local model) says it
/// is ready and is told to stop; signals are then that command's.
#[derive(Debug)]
pub struct Embedded {
    /// Gets the address once the API routes serve.
    pub ready: tokio::sync::oneshot::Sender<SocketAddr>,
    /// Drains and stops the server when it resolves (or its sender is dropped).
    pub stop: tokio::sync::oneshot::Receiver<()>,
}

/// `serve` for another command: no signal handling, readiness and stop through
/// `embedded`.
pub fn run_embedded(args: ServeArgs, embedded: Embedded) -> Result<()> {
    run_with(args, Some(embedded))
}

fn run_with(args: ServeArgs, embedded: Option<Embedded>) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tessera-http")
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(serve(args, embedded));
    // A signal during loading leaves the load running on the blocking pool; do not
    // wait for it.
    runtime.shutdown_background();
    result
}

/// Resolves once the server should stop: the first SIGTERM or Ctrl-C, or, embedded,
/// the stop of its command. A second signal ends the process at once, without the
/// drain, as a person pressing Ctrl-C again expects.
fn stop_requested(
    stop: Option<tokio::sync::oneshot::Receiver<()>>,
) -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        match stop {
            Some(stop) => {
                let _ = stop.await;
                let _ = tx.send(true);
            }
            None => {
                shutdown_signal().await;
                let _ = tx.send(true);
                shutdown_signal().await;
                tracing::warn!(
                    "second interrupt: exiting now, without waiting for running requests"
                );
                eprintln!("second interrupt: exiting now, without waiting for running requests");
                std::process::exit(SECOND_SIGNAL_EXIT_CODE);
            }
        }
    });
    rx
}

/// Exit status after a second SIGTERM or Ctrl-C: 130, a shell's status for an
/// interrupted command.
pub const SECOND_SIGNAL_EXIT_CODE: i32 = 130;

async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    // `Err` only if the sender is gone, which means it can no longer ask: wait forever.
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn listen_addr(args: &ServeArgs) -> Result<SocketAddr> {
    let port = args.port.unwrap_or(DEFAULT_PORT);
    format!("{}:{port}", args.host)
        .parse()
        .with_context(|| format!("--host {} --port {port} is not an address", args.host))
}

async fn serve(args: ServeArgs, embedded: Option<Embedded>) -> Result<()> {
    if args.model.nodes.is_worker() {
        return worker_node::serve(args).await;
    }
    let (ready, stop) = match embedded {
        Some(Embedded { ready, stop }) => (Some(ready), Some(stop)),
        None => (None, None),
    };
    let stop = stop_requested(stop);
    let addr = listen_addr(&args)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    let max_connections = fit_connections_to_open_files(args.max_connections);
    let listener = LimitedListener::new(listener, max_connections, args.conn_timeouts());
    let lifecycle = Arc::new(Lifecycle::default());
    let api = Arc::new(OnceLock::new());
    let front = front_of(&args)?;
    let app = routes::startup_router(
        Arc::clone(&lifecycle),
        &front,
        &args.allowed_origins,
        Arc::clone(&api),
        !args.no_ui,
    );
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = tokio::spawn(serve_http(listener, app, async move {
        let _ = http_stopped.await;
    }));
    tracing::info!("listening on http://{local} (loading the model)");

    let load = {
        let args = args.clone();
        let lifecycle = Arc::clone(&lifecycle);
        let front = front.clone();
        tokio::task::spawn_blocking(move || {
            let state = load_state(&args, lifecycle, &front)?;
            warm_up(&state)?;
            Ok::<_, anyhow::Error>(state)
        })
    };
    let state = tokio::select! {
        loaded = load => loaded.context("the loading task")??,
        _ = stopped(stop.clone()) => {
            tracing::info!("signal during start-up: exiting");
            return Ok(());
        }
    };
    if !state.api_keys.is_empty() {
        tracing::info!("API keys required ({} configured)", state.api_keys.len());
    }
    let _ = api.set(routes::api_router(state.clone()));
    // Started (so `/readyz` answers 200) only once the API routes are in place: a probe
    // that passed before would send requests to a 503 `model_loading`.
    state.lifecycle.set_started();
    tracing::info!("ready on http://{local}");
    if let Some(ready) = ready {
        let _ = ready.send(local);
    }

    let engine_failed = tokio::select! {
        _ = stopped(stop) => None,
        why = engine_stopped(&state.scheduler) => Some(why),
    };
    if let Some(why) = engine_failed {
        linger_after_failure(&state, why).await;
        let _ = stop_http.send(());
        if tokio::time::timeout(HTTP_DRAIN_LIMIT, http).await.is_err() {
            tracing::warn!("connections still open; closing them");
        }
        return Err(EngineFailure(why).into());
    }
    drain(&state, Duration::from_secs(args.shutdown_timeout)).await;
    let _ = stop_http.send(());
    match tokio::time::timeout(HTTP_DRAIN_LIMIT, http).await {
        Ok(joined) => joined.context("the HTTP task")?.context("serving HTTP")?,
        Err(_) => tracing::warn!("connections still open after the drain; closing them"),
    }
    let scheduler = state.scheduler.clone();
    drop(state);
    scheduler
        .join()
        .map_err(|e| anyhow::anyhow!("engine loop: {e}"))?;
    tracing::info!("shut down cleanly");
    Ok(())
}

/// Serves `app` on `listener` (each request knowing its connection) until `shutdown`
/// resolves, then lets open connections finish.
pub async fn serve_http(
    listener: LimitedListener,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<ConnHandle>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// How long HTTP connections get to flush after every sequence has ended.
const HTTP_DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// Resolves once the engine loop has stopped by itself (before any shutdown asked it
/// to), with why.
async fn engine_stopped(scheduler: &SchedulerHandle) -> &'static str {
    let mut tick = tokio::time::interval(ENGINE_WATCH_INTERVAL);
    loop {
        tick.tick().await;
        let health = scheduler.health();
        if health.executor_failed {
            return "the engine failed (a device rank failed or hung)";
        }
        if health.panicked {
            return "the engine loop panicked";
        }
        if !health.running {
            return "the engine loop stopped";
        }
    }
}

/// The engine is gone and every in-flight request has been told: give their responses
/// time to be written (and probes time to see 503), then return.
async fn linger_after_failure(state: &AppState, why: &str) {
    tracing::error!(
        "{why}: not ready, refusing new requests; exiting with status {ENGINE_FAILED_EXIT_CODE} \
         once {} in-flight responses are written",
        state.lifecycle.in_flight()
    );
    state.scheduler.close_admission();
    let written = tokio::time::timeout(HTTP_DRAIN_LIMIT, state.lifecycle.wait_idle());
    let (_, written) = tokio::join!(tokio::time::sleep(ENGINE_FAILED_LINGER), written);
    if written.is_err() {
        tracing::warn!(
            "{} responses still unwritten; exiting anyway",
            state.lifecycle.in_flight()
        );
    }
}

/// Turn readiness off, refuse new work, give running sequences `timeout` to finish,
/// then abort the rest.
pub(crate) async fn drain(state: &AppState, timeout: Duration) {
    state.lifecycle.set_draining();
    state.scheduler.close_admission();
    tracing::info!(
        "shutting down: not ready, refusing new requests; {} sequences running, waiting up to {}s",
        state.lifecycle.in_flight(),
        timeout.as_secs()
    );
    if tokio::time::timeout(timeout, state.lifecycle.wait_idle())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutdown timeout: aborting {} sequences still running",
            state.lifecycle.in_flight()
        );
    }
    state.scheduler.shutdown();
    // Aborted responses end once their last events are written.
    let _ = tokio::time::timeout(HTTP_DRAIN_LIMIT, state.lifecycle.wait_idle()).await;
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
