//! The two requests of the hub's HTTP API that a download needs, as `huggingface_hub`
//! makes them:
//!
//! - `GET /api/models/{repo}/revision/{revision}?blobs=true`: the commit a revision is
//!   at and every file with its size and digest (`lfs.sha256`, else the Git `blobId`);
//! - `GET /{repo}/resolve/{commit}/{file}`, with `Range: bytes=N-` to resume: the bytes
//!   (the hub redirects large files to its CDN; the token is not sent there).

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, RANGE};
use reqwest::StatusCode;
use serde::Deserialize;

use crate::hub::checksum::Expected;
use crate::hub::error::HubError;
use crate::hub::reference::ModelRef;
use crate::hub::settings::HubSettings;

/// A connection to the hub that does not open within this fails the attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A transfer that sends nothing for this long is cut (and resumed).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A revision of a repository: its commit and files.
#[derive(Debug, Clone)]
pub struct RepoInfo {
    pub commit: String,
    pub files: Vec<RepoFile>,
}

/// One file of a repository, as the hub lists it.
#[derive(Debug, Clone)]
pub struct RepoFile {
    /// The path in the repository.
    pub name: String,
    pub size: u64,
    pub expected: Expected,
}

impl RepoFile {
    /// The name of its blob in the cache: the hub's etag, which is the digest.
    pub fn etag(&self) -> &str {
        self.expected.hex()
    }
}

#[derive(Deserialize)]
struct InfoAnswer {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    sha256: String,
    size: u64,
}

pub struct HubClient {
    http: reqwest::Client,
    endpoint: String,
}

impl HubClient {
    pub fn new(settings: &HubSettings) -> Result<Self, HubError> {
        let mut headers = HeaderMap::new();
        if let Some(token) = &settings.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                HubError::Transfer {
                    url: settings.endpoint.clone(),
                    message: "HF_TOKEN holds characters a header cannot carry".into(),
                }
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("tessera/", env!("CARGO_PKG_VERSION")))
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| HubError::Transfer {
                url: settings.endpoint.clone(),
                message: e.to_string(),
            })?;
        Ok(HubClient {
            http,
            endpoint: settings.endpoint.clone(),
        })
    }

    /// The commit and files of `model`'s revision.
    pub async fn repo_info(&self, model: &ModelRef) -> Result<RepoInfo, HubError> {
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.endpoint,
            model.repo,
            encode(&model.revision, false)
        );
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| transfer(&url, &e))?;
        let status = response.status();
        let error_code = response
            .headers()
            .get("x-error-code")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        match status {
            s if s.is_success() => {}
            StatusCode::NOT_FOUND => return Err(self.not_found(model)),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(if error_code.ends_with("NotFound") {
                    self.not_found(model)
                } else {
                    HubError::Unauthorized {
                        repo: model.repo.clone(),
                        endpoint: self.endpoint.clone(),
                        status: status.as_u16(),
                    }
                });
            }
            other => {
                return Err(HubError::Transfer {
                    url,
                    message: format!("the hub answered {other}"),
                })
            }
        }
        let body = response.bytes().await.map_err(|e| transfer(&url, &e))?;
        let answer: InfoAnswer =
            serde_json::from_slice(&body).map_err(|e| HubError::BadAnswer {
                url: url.clone(),
                message: e.to_string(),
            })?;
        let files = answer
            .siblings
            .into_iter()
            .map(|s| match (s.lfs, s.blob_id, s.size) {
                (Some(lfs), _, _) => Ok(RepoFile {
                    name: s.rfilename,
                    size: lfs.size,
                    expected: Expected::Sha256(lfs.sha256.to_ascii_lowercase()),
                }),
                (None, Some(blob), Some(size)) => Ok(RepoFile {
                    name: s.rfilename,
                    size,
                    expected: Expected::GitBlob(blob.to_ascii_lowercase()),
                }),
                _ => Err(HubError::BadAnswer {
                    url: url.clone(),
                    message: format!("{} is listed without its size and digest", s.rfilename),
                }),
            })
            .collect::<Result<_, _>>()?;
        let commit = answer.sha;
        if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(HubError::BadAnswer {
                url,
                message: format!("`{commit}` is not a commit"),
            });
        }
        Ok(RepoInfo { commit, files })
    }

    /// The URL of `file` at `commit`.
    pub fn file_url(&self, model: &ModelRef, commit: &str, file: &str) -> String {
        format!(
            "{}/{}/resolve/{commit}/{}",
            self.endpoint,
            model.repo,
            encode(file, true)
        )
    }

    /// Starts the transfer of `url` from byte `from`; the caller checks whether the
    /// answer resumed (206) or starts over (200).
    pub async fn open(&self, url: &str, from: u64) -> Result<reqwest::Response, HubError> {
        let mut request = self.http.get(url);
        if from > 0 {
            request = request.header(RANGE, format!("bytes={from}-"));
        }
        let response = request.send().await.map_err(|e| transfer(url, &e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        Err(HubError::Transfer {
            url: url.to_string(),
            message: format!("the hub answered {status}"),
        })
    }

    fn not_found(&self, model: &ModelRef) -> HubError {
        HubError::NotFound {
            repo: model.repo.clone(),
            revision: model.revision.clone(),
            endpoint: self.endpoint.clone(),
        }
    }
}

/// A transfer error with its causes (reqwest's top-level message alone says little).
pub fn transfer(url: &str, e: &reqwest::Error) -> HubError {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    HubError::Transfer {
        url: url.to_string(),
        message,
    }
}

/// `text` percent-encoded for a URL path: a revision is one segment (`refs/pr/1` as
/// `refs%2Fpr%2F1`, as the hub client sends it), a file path keeps its `/`.
fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
        if plain || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_are_one_segment_and_files_keep_their_folders() {
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("Q4 K/m.gguf", true), "Q4%20K/m.gguf");
    }
}
