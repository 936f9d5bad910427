//! Every way getting a model from the hub can fail, each naming what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The hub has no such repository or revision (or hides a private one).
    #[error(
        "`{repo}` is not a file or folder here, and the hub at {endpoint} has no repository \
         `{repo}` at revision `{revision}` (a private repository needs a token in HF_TOKEN)"
    )]
    NotFound {
        repo: String,
        revision: String,
        endpoint: String,
    },
    /// The hub wants a token, or a better one (a gated or private repository).
    #[error(
        "the hub at {endpoint} refused `{repo}` ({status}): a gated or private repository \
         needs a token with access to it in HF_TOKEN"
    )]
    Unauthorized {
        repo: String,
        endpoint: String,
        status: u16,
    },
    /// The repository has no file that fits the request (the message lists what it has).
    #[error("{0}")]
    NoMatch(String),
    /// Offline mode and the model is not in the cache.
    #[error(
        "HF_HUB_OFFLINE is set and `{model}` (revision `{revision}`) is not in the cache at \
         {cache}{missing}; download it once with the hub reachable, or unset HF_HUB_OFFLINE"
    )]
    NotCached {
        model: String,
        revision: String,
        cache: PathBuf,
        missing: String,
    },
    /// A downloaded file is not the one the hub lists: it was discarded.
    #[error(
        "{file}: the downloaded {size} bytes have {algorithm} {actual}, but the hub lists \
         {expected}; the download was discarded, nothing was kept"
    )]
    Corrupt {
        file: String,
        size: u64,
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    /// The transfer failed, and went on failing after the retries.
    #[error("downloading from {url}: {message}")]
    Transfer { url: String, message: String },
    /// The hub answered something its API does not answer.
    #[error("the hub's answer to {url} is not what its API returns: {message}")]
    BadAnswer { url: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl HubError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HubError {
        let path = path.into();
        move |source| HubError::Io { path, source }
    }
}
