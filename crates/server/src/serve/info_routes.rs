//! Routes that describe the server: models, health, metrics, the OpenAPI document, and
//! the JSON 404/405 fallbacks.

use axum::extract::{Path, State};
use axum::http::{header, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::models::{ModelCard, ModelList};
use crate::serve::error::ServerError;
use crate::serve::state::AppState;

fn card(app: &AppState) -> ModelCard {
    ModelCard {
        id: app.model_name().to_string(),
        object: "model",
        created: app.started_unix,
        owned_by: "tessera",
        max_model_len: app.validation.max_model_len,
    }
}

pub async fn list_models(State(app): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![card(&app)],
    })
}

pub async fn get_model(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ServerError> {
    if id != app.model_name() {
        return Err(ServerError::ModelNotFound(id));
    }
    Ok(Json(card(&app)))
}

pub async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

pub async fn openapi() -> Json<serde_json::Value> {
    Json(crate::api::openapi::document())
}

/// Scheduler metrics in the Prometheus text format.
pub async fn metrics(State(app): State<AppState>) -> Response {
    let m = app.scheduler.metrics();
    let gauges: [(&str, &str, f64); 10] = [
        (
            "tessera_num_requests_running",
            "Sequences running",
            m.num_running as f64,
        ),
        (
            "tessera_num_requests_waiting",
            "Sequences waiting",
            m.num_waiting as f64,
        ),
        (
            "tessera_kv_cache_usage_ratio",
            "KV blocks in use / all",
            m.kv_usage_fraction,
        ),
        (
            "tessera_kv_blocks_in_use",
            "KV blocks held by sequences",
            m.kv_blocks_in_use as f64,
        ),
        (
            "tessera_kv_blocks_total",
            "KV blocks in the cache",
            m.kv_blocks_total as f64,
        ),
        (
            "tessera_preemptions_total",
            "Sequences preempted",
            m.preemptions_total as f64,
        ),
        (
            "tessera_steps_total",
            "Engine steps applied",
            m.steps_total as f64,
        ),
        (
            "tessera_prompt_tokens_total",
            "Prompt tokens started",
            m.prompt_tokens_total as f64,
        ),
        (
            "tessera_generation_tokens_total",
            "Tokens generated",
            m.generation_tokens_total as f64,
        ),
        (
            "tessera_prefix_cache_hits_tokens_total",
            "Prompt tokens found in the prefix cache",
            m.prefix_cache_hits_tokens as f64,
        ),
    ];
    let mut text = String::new();
    for (name, help, value) in gauges {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
        ));
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn not_found(method: Method, uri: Uri) -> ServerError {
    ServerError::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> ServerError {
    ServerError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}
