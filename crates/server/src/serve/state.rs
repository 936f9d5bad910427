//! `AppState`: what every handler shares. Cheap to clone; no lock around the engine
//! (the scheduler handle talks to the engine loop over a channel).

use std::sync::Arc;

use axum::extract::FromRef;

use tessera_scheduler::SchedulerHandle;

use crate::api::error::ServerError;
use crate::api::valid_request::ValidationContext;
use crate::runner::{PoolingSetup, Runner};
use crate::serve::lifecycle::Lifecycle;
use crate::serve::limits::ServerLimits;
use crate::serve::metrics::ServerMetrics;

#[derive(Debug, Clone)]
pub struct AppState {
    pub scheduler: SchedulerHandle,
    pub validation: Arc<ValidationContext>,
    /// Accepted API keys; empty means no authentication.
    pub api_keys: Arc<Vec<String>>,
    pub max_body_bytes: usize,
    /// Header size, request time and stream buffer limits.
    pub limits: ServerLimits,
    /// Unix time the server started (the model's `created`).
    pub started_unix: u64,
    /// Start-up phase, drain flag and in-flight count, for probes and shutdown.
    pub lifecycle: Arc<Lifecycle>,
    /// Latencies and HTTP counts the server measures itself.
    pub metrics: Arc<ServerMetrics>,
    /// Per-rank step and collective times of the real engine (none with a fake one).
    pub engine_stats: Option<tessera_engine::EngineStats>,
    /// Serve the chat page at `/` (not with `--no-ui`).
    pub ui: bool,
    /// Whether the model generates or embeds (`--runner`).
    pub runner: Arc<Runner>,
}

impl AppState {
    /// The name replies and metrics report (the first served name).
    pub fn model_name(&self) -> &str {
        self.validation.served_model_names.primary()
    }

    /// Refuses a generating route on an embedding server.
    pub fn require_generate(&self) -> Result<(), ServerError> {
        match self.runner.pooling() {
            None => Ok(()),
            Some(_) => Err(ServerError::InvalidRequest {
                message: "this server runs an embedding model (--runner pooling): it serves \
                          /v1/embeddings, not generation"
                    .into(),
                param: None,
            }),
        }
    }

    /// How embeddings are pooled, or a refusal on a generating server.
    pub fn require_pooling(&self) -> Result<&PoolingSetup, ServerError> {
        self.runner
            .pooling()
            .ok_or_else(|| ServerError::InvalidRequest {
                message: "this server runs a generating model: start it with --runner pooling \
                      and an embedding model to serve /v1/embeddings"
                    .into(),
                param: None,
            })
    }
}

/// The probes' handlers take only the lifecycle.
impl FromRef<AppState> for Arc<Lifecycle> {
    fn from_ref(app: &AppState) -> Self {
        Arc::clone(&app.lifecycle)
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A random id suffix for `chatcmpl-…` / `cmpl-…`.
pub fn random_id() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..24)
        .map(|_| {
            let v: u8 = rng.random_range(0..36);
            char::from_digit(u32::from(v), 36).unwrap_or('0')
        })
        .collect()
}
