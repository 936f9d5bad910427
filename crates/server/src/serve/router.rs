//! The route table and the layers around it. [`routes`] is the single list the router
//! is built from, so tests can check it against the OpenAPI document.

use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use tower::ServiceExt;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api::error::ServerError;
use crate::serve::lifecycle::{self, Lifecycle};
use crate::serve::state::AppState;
use crate::serve::{
    auth, chat_route, completion_route, info_routes, metrics, request_context, responses_route,
    tokenize_route,
};

/// A route: method, path as the OpenAPI document writes it, and its handler.
pub struct Route {
    /// The method `handler` answers; read by the OpenAPI consistency test.
    #[cfg_attr(not(test), allow(dead_code))]
    pub method: Method,
    pub path: &'static str,
    /// Reachable without an API key.
    pub open: bool,
    pub handler: MethodRouter<AppState>,
}

/// Every route the server has.
pub fn routes() -> Vec<Route> {
    let r = |method: Method, path, open, handler| Route {
        method,
        path,
        open,
        handler,
    };
    vec![
        r(
            Method::POST,
            "/v1/chat/completions",
            false,
            post(chat_route::chat_completions),
        ),
        r(
            Method::POST,
            "/v1/completions",
            false,
            post(completion_route::completions),
        ),
        r(
            Method::POST,
            "/v1/responses",
            false,
            post(responses_route::create_response),
        ),
        r(
            Method::GET,
            "/v1/models",
            false,
            get(info_routes::list_models),
        ),
        r(
            Method::GET,
            "/v1/models/{id}",
            false,
            get(info_routes::get_model),
        ),
        r(
            Method::POST,
            "/tokenize",
            false,
            post(tokenize_route::tokenize),
        ),
        r(
            Method::POST,
            "/detokenize",
            false,
            post(tokenize_route::detokenize),
        ),
        r(Method::GET, "/metrics", false, get(metrics::metrics)),
        r(
            Method::GET,
            "/openapi.json",
            false,
            get(info_routes::openapi),
        ),
        r(Method::GET, "/health", true, get(lifecycle::readyz)),
        r(Method::GET, "/livez", true, get(lifecycle::livez)),
        r(Method::GET, "/readyz", true, get(lifecycle::readyz)),
        r(Method::GET, "/startupz", true, get(lifecycle::startupz)),
    ]
}

/// The route template a path falls under, for metric labels (bounded cardinality:
/// unknown paths are all `unmatched`).
pub fn route_template(path: &str) -> &'static str {
    const PATHS: &[&str] = &[
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/metrics",
        "/openapi.json",
        "/health",
        "/livez",
        "/readyz",
        "/startupz",
    ];
    if let Some(p) = PATHS.iter().copied().find(|p| *p == path) {
        return p;
    }
    match path.strip_prefix("/v1/models/") {
        Some(id) if !id.is_empty() && !id.contains('/') => "/v1/models/{id}",
        _ => "unmatched",
    }
}

/// CORS: off unless origins are given; `*` allows any origin.
pub fn cors_layer(allowed_origins: &[String]) -> Option<CorsLayer> {
    if allowed_origins.is_empty() {
        return None;
    }
    let origin = if allowed_origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            allowed_origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]),
    )
}

pub fn build_router(state: AppState, allowed_origins: &[String]) -> Router {
    let mut protected = Router::new();
    let mut open = Router::new();
    for route in routes() {
        if route.open {
            open = open.route(route.path, route.handler);
        } else {
            protected = protected.route(route.path, route.handler);
        }
    }
    let protected = protected.route_layer(from_fn_with_state(state.clone(), auth::require_api_key));
    let mut router = protected
        .merge(open)
        .fallback(info_routes::not_found)
        .method_not_allowed_fallback(info_routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(from_fn_with_state(
            state.clone(),
            request_context::request_context,
        ))
        .with_state(state);
    if let Some(cors) = cors_layer(allowed_origins) {
        router = router.layer(cors);
    }
    router
}

/// The router served from the moment the port is bound: the probes answer from
/// `lifecycle`, and everything else goes to `app` once it is set (after loading and
/// warm-up), or gets a 503 `model_loading` until then.
pub fn startup_router(lifecycle: Arc<Lifecycle>, app: Arc<OnceLock<Router>>) -> Router {
    let forward = tower::service_fn(move |req: Request| {
        let app = app.get().cloned();
        async move {
            match app {
                Some(router) => router.oneshot(req).await,
                None => Ok(ServerError::Starting.into_response()),
            }
        }
    });
    Router::new()
        .route("/livez", get(lifecycle::livez))
        .route("/startupz", get(lifecycle::startupz))
        .route("/readyz", get(lifecycle::readyz))
        .route("/health", get(lifecycle::readyz))
        .with_state(lifecycle)
        .fallback_service(forward)
}
