//! `tessera serve --nnodes N --node-rank R` with R > 0: a worker node. It joins the
//! leader at rendezvous, loads its share of the ranks and runs the leader's steps; it
//! serves no API. With `--port` it answers the probes of its pod as the leader does
//! (JSON bodies, request ids, the same layers): `/livez` 200 while the process runs,
//! `/readyz` 200 once it has joined and loaded, 503 `joining` before.
//!
//! Exit status: 1 when it could not join (no leader within `--node-join-timeout`, or
//! refused at rendezvous: the message names the flag the nodes disagree on);
//! [`ENGINE_FAILED_EXIT_CODE`](super::ENGINE_FAILED_EXIT_CODE) when the group it
//! served in ended (the leader went away or went quiet, or a rank failed), so that the
//! orchestrator restarts the group; 0 on SIGTERM/Ctrl-C.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tessera_engine::Engine;

use super::{front_of, shutdown_signal, EngineFailure, ServeArgs};

async fn livez() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

async fn readyz(State(ready): State<Arc<AtomicBool>>) -> Response {
    if ready.load(Ordering::SeqCst) {
        Json(json!({"status": "ok"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": "joining"})),
        )
            .into_response()
    }
}

pub(super) async fn serve(args: ServeArgs) -> Result<()> {
    #[cfg(feature = "fault-injection")]
    if args.inject_fault.is_some() {
        anyhow::bail!(
            "--inject-fault is armed on the leader (node rank 0), which sends the fault to \
             the node that runs the rank"
        );
    }
    let mut cfg = args.model.engine_config()?;
    cfg.max_model_len = args.max_model_len;
    let node = args.model.nodes.node_rank;
    let ready = Arc::new(AtomicBool::new(false));
    if let Some(port) = args.port {
        let addr = format!("{}:{port}", args.host);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        let app = Router::new()
            .route("/livez", get(livez))
            .route("/readyz", get(readyz))
            .fallback(crate::serve::routes::info::not_found)
            .method_not_allowed_fallback(crate::serve::routes::info::method_not_allowed)
            .with_state(Arc::clone(&ready));
        // The leader's layers: request ids, header and time limits, the HTTP counts.
        // The probes are open; nothing else is served here.
        let app = crate::serve::middleware::front(app, &front_of(&args)?, &[]);
        // The same connection hygiene as the leader's port.
        let listener = crate::serve::connection::LimitedListener::new(
            listener,
            crate::serve::connection::fit_connections_to_open_files(args.max_connections),
            args.conn_timeouts(),
        );
        tokio::spawn(crate::serve::serve_http(
            listener,
            app,
            std::future::pending(),
        ));
        tracing::info!("listening on http://{local} (worker node {node}: probes only)");
    }
    let work = {
        let ready = Arc::clone(&ready);
        tokio::task::spawn_blocking(move || {
            let mut engine = Engine::load(&cfg).context("joining the group of nodes")?;
            ready.store(true, Ordering::SeqCst);
            let why = match engine.serve_leader() {
                Ok(()) => "the leader's steps ended".to_string(),
                Err(e) => e.to_string(),
            };
            ready.store(false, Ordering::SeqCst);
            Ok::<_, anyhow::Error>(why)
        })
    };
    tokio::select! {
        done = work => {
            let why = done.context("the node task")??;
            tracing::error!("worker node {node} stops: {why}");
            Err(EngineFailure("the group of nodes this worker served ended").into())
        }
        _ = shutdown_signal() => {
            tracing::info!("signal: worker node {node} exits");
            Ok(())
        }
    }
}
