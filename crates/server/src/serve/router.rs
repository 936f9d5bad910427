//! The route table. [`routes`] is the single list the router is built from, the layers
//! in front read (route labels, which paths are open) and tests check against the
//! OpenAPI document.

use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue, Method};
use axum::response::IntoResponse;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use tower::ServiceExt;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api::error::ServerError;
use crate::serve::lifecycle::{self, Lifecycle};
use crate::serve::middleware::{front, Front};
use crate::serve::state::AppState;
use crate::serve::{
    chat_route, completion_route, info_routes, metrics, responses_route, tokenize_route,
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

/// The path templates of [`routes`] and which are open, read by the layers in front of
/// the routes (metric labels, authentication): one list for both.
#[derive(Debug)]
pub struct RouteTable(Vec<(&'static str, bool)>);

/// The table of [`routes`], made once.
pub fn route_table() -> &'static RouteTable {
    static TABLE: OnceLock<RouteTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut paths: Vec<(&'static str, bool)> = Vec::new();
        for route in routes() {
            if !paths.iter().any(|(p, _)| *p == route.path) {
                paths.push((route.path, route.open));
            }
        }
        RouteTable(paths)
    })
}

impl RouteTable {
    /// The template `path` falls under, for metric labels (bounded cardinality: unknown
    /// paths are all `unmatched`).
    pub fn template(&self, path: &str) -> &'static str {
        self.find(path).map_or("unmatched", |(p, _)| p)
    }

    /// Whether `path` is reachable without an API key (the probes).
    pub fn is_open(&self, path: &str) -> bool {
        self.find(path).is_some_and(|(_, open)| open)
    }

    fn find(&self, path: &str) -> Option<(&'static str, bool)> {
        self.0
            .iter()
            .copied()
            .find(|(template, _)| template_matches(template, path))
    }
}

/// Whether `path` fits `template`, where a `{name}` segment stands for any one
/// non-empty segment.
fn template_matches(template: &str, path: &str) -> bool {
    let mut want = template.split('/');
    let mut got = path.split('/');
    loop {
        match (want.next(), got.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) if w.starts_with('{') && w.ends_with('}') => {
                if g.is_empty() {
                    return false;
                }
            }
            (Some(w), Some(g)) if w == g => {}
            _ => return false,
        }
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

/// Every route with its handler, the JSON 404/405 fallbacks and the body limit; the
/// layers in front of them are [`front`]'s.
pub fn api_router(state: AppState) -> Router {
    let mut router = Router::new();
    for route in routes() {
        router = router.route(route.path, route.handler);
    }
    router
        .fallback(info_routes::not_found)
        .method_not_allowed_fallback(info_routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

/// A loaded server's whole router: [`api_router`] behind [`front`].
pub fn build_router(state: AppState, allowed_origins: &[String]) -> Router {
    let layers = Front::of(&state);
    front(api_router(state), &layers, allowed_origins)
}

/// The router served from the moment the port is bound, behind the same layers: the
/// probes answer from `lifecycle`, and everything else goes to `app` once it is set
/// (after loading and warm-up: [`api_router`]), or gets a 503 `model_loading` until then.
pub fn startup_router(
    lifecycle: Arc<Lifecycle>,
    layers: &Front,
    allowed_origins: &[String],
    app: Arc<OnceLock<Router>>,
) -> Router {
    let forward = tower::service_fn(move |req: Request| {
        let app = app.get().cloned();
        async move {
            match app {
                Some(router) => router.oneshot(req).await,
                None => Ok(ServerError::Starting.into_response()),
            }
        }
    });
    let probes = Router::new()
        .route("/livez", get(lifecycle::livez))
        .route("/startupz", get(lifecycle::startupz))
        .route("/readyz", get(lifecycle::readyz))
        .route("/health", get(lifecycle::readyz))
        .method_not_allowed_fallback(info_routes::method_not_allowed)
        .with_state(lifecycle)
        .fallback_service(forward);
    front(probes, layers, allowed_origins)
}
