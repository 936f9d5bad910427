//! Every route the server has, as method, path (as the OpenAPI document writes it) and
//! whether it is open (reachable without an API key): the one list the router is built
//! from (`router::routes` gives each its handler), the layers in front read (route
//! labels for metrics and logs, which paths need a key) and tests check against the
//! OpenAPI document.

use axum::http::Method;

/// One route of [`ROUTES`].
#[derive(Debug, Clone)]
pub struct RouteSpec {
    pub method: Method,
    pub path: &'static str,
    /// Reachable without an API key (the probes, and the chat page, which asks for the
    /// key itself).
    pub open: bool,
}

const fn route(method: Method, path: &'static str, open: bool) -> RouteSpec {
    RouteSpec { method, path, open }
}

/// Every route.
pub const ROUTES: &[RouteSpec] = &[
    route(Method::POST, "/v1/chat/completions", false),
    route(Method::POST, "/v1/completions", false),
    route(Method::POST, "/v1/responses", false),
    route(Method::POST, "/v1/messages", false),
    route(Method::POST, "/v1/messages/count_tokens", false),
    route(Method::POST, "/v1/embeddings", false),
    route(Method::POST, "/v1/rerank", false),
    route(Method::POST, "/rerank", false),
    route(Method::GET, "/v1/models", false),
    route(Method::GET, "/v1/models/{id}", false),
    route(Method::POST, "/tokenize", false),
    route(Method::POST, "/detokenize", false),
    route(Method::GET, "/metrics", false),
    route(Method::GET, "/openapi.json", false),
    route(Method::GET, "/health", true),
    route(Method::GET, "/livez", true),
    route(Method::GET, "/readyz", true),
    route(Method::GET, "/startupz", true),
    route(Method::GET, "/", true),
];

/// The template `path` falls under, for metric labels (bounded cardinality: unknown
/// paths are all `unmatched`).
pub fn template(path: &str) -> &'static str {
    find(path).map_or("unmatched", |r| r.path)
}

/// Whether `path` is one of the Messages API's (Anthropic's), whose errors leave in
/// Anthropic's envelope.
pub fn is_messages(path: &str) -> bool {
    matches!(template(path), "/v1/messages" | "/v1/messages/count_tokens")
}

/// Whether `path` is reachable without an API key.
pub fn is_open(path: &str) -> bool {
    find(path).is_some_and(|r| r.open)
}

fn find(path: &str) -> Option<&'static RouteSpec> {
    ROUTES.iter().find(|r| template_matches(r.path, path))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_its_own_label_and_others_are_unmatched() {
        for r in ROUTES {
            let example = r.path.replace("{id}", "some-model");
            assert_eq!(template(&example), r.path);
        }
        assert_eq!(template("/v1/responses"), "/v1/responses");
        assert_eq!(template("/v1/models/a/b"), "unmatched");
        assert_eq!(template("/v1/models/"), "unmatched");
        assert_eq!(template("/v1/chat/completions/x"), "unmatched");
        assert_eq!(template("/"), "/");
        assert_eq!(template("/index.html"), "unmatched");
        assert!(is_open("/readyz") && is_open("/health") && is_open("/"));
        assert!(is_open("/livez") && is_open("/startupz"));
        assert!(!is_open("/v1/models") && !is_open("/nope"));
    }
}
