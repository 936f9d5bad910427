//! The layers every request passes through, from the moment the port is bound (before
//! the model has loaded, probes included): the request context (id, log span, metrics,
//! limits, the connection's request tracking) and then authentication. They wrap the
//! start-up router and the API router alike ([`front`]).

pub mod auth;
mod cors;
pub(crate) mod envelope;
pub mod request_context;

use std::sync::Arc;

use axum::middleware::from_fn_with_state;
use axum::Router;

use crate::serve::limits::ServerLimits;
use crate::serve::metrics::ServerMetrics;
use crate::serve::middleware::cors::cors_layer;
use crate::serve::state::AppState;

/// What the layers need, all known before the model loads.
#[derive(Debug, Clone)]
pub struct Front {
    pub metrics: Arc<ServerMetrics>,
    pub limits: ServerLimits,
    /// Accepted API keys; empty means no authentication.
    pub api_keys: Arc<Vec<String>>,
    pub max_body_bytes: usize,
}

impl Front {
    /// The front of a loaded server's state.
    pub fn of(app: &AppState) -> Self {
        Self {
            metrics: Arc::clone(&app.metrics),
            limits: app.limits,
            api_keys: Arc::clone(&app.api_keys),
            max_body_bytes: app.max_body_bytes,
        }
    }
}

/// `router` behind the layers: CORS (when origins are allowed) outermost, then the
/// request context, then authentication.
pub fn front(router: Router, front: &Front, allowed_origins: &[String]) -> Router {
    let router = router
        .layer(from_fn_with_state(front.clone(), auth::require_api_key))
        .layer(from_fn_with_state(
            front.clone(),
            request_context::request_context,
        ));
    match cors_layer(allowed_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    }
}
