//! The routes, one file per route family, and the routers made of them: the API router
//! (every route of the [`table`] with its handler) and the start-up router that answers
//! probes while the model loads, both behind the layers of [`front`].

pub mod chat;
pub mod chat_tools;
pub mod completions;
pub mod embeddings;
pub mod info;
pub mod messages;
pub mod metrics;
pub mod rerank;
pub mod responses;
pub mod table;
pub mod tokenize;
pub mod ui;

use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::Method;
use axum::response::IntoResponse;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use tower::ServiceExt;

use crate::api::error::ServerError;
use crate::serve::lifecycle::{self, Lifecycle};
use crate::serve::middleware::{front, Front};
use crate::serve::state::AppState;
use table::ROUTES;

/// A route of the table with its handler.
pub struct Route {
    /// The method `handler` answers; read by the OpenAPI consistency test.
    #[cfg_attr(not(test), allow(dead_code))]
    pub method: Method,
    pub path: &'static str,
    pub handler: MethodRouter<AppState>,
}

/// Every route of [`ROUTES`] with its handler (a route without one is left out, which
/// `every_route_of_the_table_has_a_handler` catches).
pub fn routes() -> Vec<Route> {
    ROUTES
        .iter()
        .filter_map(|r| {
            Some(Route {
                method: r.method.clone(),
                path: r.path,
                handler: handler(r.path)?,
            })
        })
        .collect()
}

/// The handler of the route at `path`.
fn handler(path: &str) -> Option<MethodRouter<AppState>> {
    Some(match path {
        "/v1/chat/completions" => post(chat::chat_completions),
        "/v1/completions" => post(completions::completions),
        "/v1/responses" => post(responses::create_response),
        "/v1/messages" => post(messages::create_message),
        "/v1/embeddings" => post(embeddings::create_embeddings),
        "/v1/rerank" | "/rerank" => post(rerank::rerank),
        "/v1/messages/count_tokens" => post(messages::count_tokens),
        "/v1/models" => get(info::list_models),
        "/v1/models/{id}" => get(info::get_model),
        "/tokenize" => post(tokenize::tokenize),
        "/detokenize" => post(tokenize::detokenize),
        "/metrics" => get(metrics::metrics),
        "/openapi.json" => get(info::openapi),
        "/health" | "/readyz" => get(lifecycle::readyz),
        "/livez" => get(lifecycle::livez),
        "/startupz" => get(lifecycle::startupz),
        "/" => get(ui::chat_page),
        _ => return None,
    })
}

/// Every route with its handler (the chat page only where `state.ui` says), the JSON
/// 404/405 fallbacks and the body limit; the layers in front of them are [`front`]'s.
pub fn api_router(state: AppState) -> Router {
    let mut router = Router::new();
    for route in routes() {
        if route.path == "/" && !state.ui {
            continue;
        }
        router = router.route(route.path, route.handler);
    }
    router
        .fallback(info::not_found)
        .method_not_allowed_fallback(info::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

/// A loaded server's whole router: [`api_router`] behind [`front`].
pub fn build_router(state: AppState, allowed_origins: &[String]) -> Router {
    let layers = Front::of(&state);
    front(api_router(state), &layers, allowed_origins)
}

/// The router served from the moment the port is bound, behind the same layers: the
/// probes answer from `lifecycle`, the chat page (where `ui` says) is served at once,
/// `/metrics` gives the HTTP counts while the model loads, and everything else goes to
/// `app` once it is set (after loading and warm-up: [`api_router`]), or gets a 503
/// `model_loading` until then.
pub fn startup_router(
    lifecycle: Arc<Lifecycle>,
    layers: &Front,
    allowed_origins: &[String],
    app: Arc<OnceLock<Router>>,
    ui: bool,
) -> Router {
    let forward = {
        let app = Arc::clone(&app);
        tower::service_fn(move |req: Request| {
            let app = app.get().cloned();
            async move {
                match app {
                    Some(router) => router.oneshot(req).await,
                    None => Ok(ServerError::Starting.into_response()),
                }
            }
        })
    };
    let server_metrics = Arc::clone(&layers.metrics);
    let metrics_route = get(move |req: Request| {
        let app = app.get().cloned();
        let server_metrics = Arc::clone(&server_metrics);
        async move {
            match app {
                Some(router) => router.oneshot(req).await.into_response(),
                None => metrics::loading(&server_metrics),
            }
        }
    });
    let mut probes = Router::new()
        .route("/livez", get(lifecycle::livez))
        .route("/startupz", get(lifecycle::startupz))
        .route("/readyz", get(lifecycle::readyz))
        .route("/health", get(lifecycle::readyz))
        .route("/metrics", metrics_route);
    if ui {
        probes = probes.route("/", get(ui::chat_page));
    }
    let probes = probes
        .method_not_allowed_fallback(info::method_not_allowed)
        .with_state(lifecycle)
        .fallback_service(forward);
    front(probes, layers, allowed_origins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_table_has_a_handler() {
        let paths: Vec<&str> = routes().iter().map(|r| r.path).collect();
        let table: Vec<&str> = ROUTES.iter().map(|r| r.path).collect();
        assert_eq!(paths, table);
    }
}
