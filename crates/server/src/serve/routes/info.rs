//! Routes that describe the server: models, the OpenAPI document, and
//! the JSON 404/405 fallbacks.

use axum::extract::{Path, State};
use axum::http::{Method, Uri};
use axum::Json;

use crate::api::error::ServerError;
use crate::api::models::{ModelCard, ModelList};
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

pub async fn openapi(State(app): State<AppState>) -> Json<serde_json::Value> {
    Json(crate::api::openapi::document_for(app.model_name()))
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
