//! Routes that describe the server: models, the OpenAPI document, and
//! the JSON 404/405 fallbacks.

use axum::extract::{Path, State};
use axum::http::{Method, Uri};
use axum::Json;

use crate::api::error::ServerError;
use crate::api::models::{ModelCard, ModelList};
use crate::serve::state::AppState;

fn card(app: &AppState, id: &str) -> ModelCard {
    ModelCard {
        id: id.to_string(),
        object: "model",
        created: app.started_unix,
        owned_by: "tessera",
        max_model_len: app.validation.max_model_len,
    }
}

pub async fn list_models(State(app): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: app
            .validation
            .served_model_names
            .all()
            .iter()
            .map(|name| card(&app, name))
            .collect(),
    })
}

pub async fn get_model(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ServerError> {
    app.validation.served_model_names.check(&id)?;
    Ok(Json(card(&app, &id)))
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
