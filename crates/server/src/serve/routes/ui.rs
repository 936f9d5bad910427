//! `GET /`: the chat page, one self-contained HTML file with its script (no build step,
//! nothing fetched from elsewhere). It streams through `/v1/chat/completions` like any
//! client and asks for the API key when the API answers 401, so the page itself needs
//! no key. On by default, as llama-server's; `--no-ui` turns it off (then `/` is a 404).

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

/// The page.
pub const PAGE: &str = include_str!("chat_page.html");

/// Only this page's own inline script and style run, and it talks to this server only.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'none'";

/// `GET /`.
pub async fn chat_page() -> Response {
    (
        [
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Html(PAGE),
    )
        .into_response()
}
