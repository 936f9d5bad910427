//! A Hugging Face hub on loopback that answers the API paths the hub client uses, as the
//! real hub answers them: the revision listing (`/api/models/{repo}/revision/{rev}`
//! with sizes, blob ids and LFS digests) and the file route (`/{repo}/resolve/{rev}/
//! {file}`) with byte ranges, LFS files redirected to a second server (the CDN, another
//! origin). It logs every request, and can cut a transfer short, corrupt a file, or
//! require a token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha1::Digest as _;

/// The commit every mock repository is at.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A file of a mock repository.
#[derive(Clone)]
pub struct MockFile {
    pub name: String,
    pub bytes: Arc<Vec<u8>>,
    /// Stored with LFS: listed with a SHA-256 and served from the CDN.
    pub lfs: bool,
}

impl MockFile {
    pub fn new(name: &str, bytes: Vec<u8>, lfs: bool) -> Self {
        MockFile {
            name: name.to_string(),
            bytes: Arc::new(bytes),
            lfs,
        }
    }

    pub fn sha256(&self) -> String {
        hex(&sha2::Sha256::digest(self.bytes.as_slice()))
    }

    fn blob_id(&self) -> String {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", self.bytes.len()).as_bytes());
        h.update(self.bytes.as_slice());
        hex(&h.finalize())
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Deterministic bytes that do not compress to a pattern.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// One request the hub or its CDN received.
#[derive(Debug, Clone)]
pub struct Logged {
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Default)]
pub struct Behaviour {
    /// Cut the first transfer of these files after this many bytes.
    pub cut_first_transfer_at: HashMap<String, usize>,
    /// Serve these files with one byte changed.
    pub corrupt: Vec<String>,
    /// Answer 401 to listings without this bearer token.
    pub token: Option<String>,
}

#[derive(Clone)]
struct Hub {
    repos: Arc<HashMap<String, Vec<MockFile>>>,
    behaviour: Arc<Mutex<Behaviour>>,
    log: Arc<Mutex<Vec<Logged>>>,
    cdn_base: String,
}

pub struct MockHub {
    pub base: String,
    pub log: Arc<Mutex<Vec<Logged>>>,
    pub behaviour: Arc<Mutex<Behaviour>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for MockHub {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl MockHub {
    /// Starts the hub and its CDN on a runtime of their own (for tests that call the
    /// blocking client or run the binary).
    pub fn start(repos: Vec<(&str, Vec<MockFile>)>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut hub = runtime.block_on(Self::start_async(repos));
        hub._runtime = Some(runtime);
        hub
    }

    pub async fn start_async(repos: Vec<(&str, Vec<MockFile>)>) -> Self {
        let api = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let cdn = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", api.local_addr().expect("addr"));
        let cdn_base = format!("http://{}", cdn.local_addr().expect("addr"));
        let hub = Hub {
            repos: Arc::new(
                repos
                    .into_iter()
                    .map(|(name, files)| (name.to_string(), files))
                    .collect(),
            ),
            behaviour: Arc::default(),
            log: Arc::default(),
            cdn_base,
        };
        let api_app = Router::new()
            .route("/api/models/{org}/{repo}/revision/{rev}", get(listing))
            .route("/{org}/{repo}/resolve/{rev}/{*path}", get(resolve))
            .with_state(hub.clone());
        let cdn_app = Router::new()
            .route("/cdn/{org}/{repo}/{*path}", get(cdn_file))
            .with_state(hub.clone());
        let tasks = vec![
            tokio::spawn(async move {
                let _ = axum::serve(api, api_app).await;
            }),
            tokio::spawn(async move {
                let _ = axum::serve(cdn, cdn_app).await;
            }),
        ];
        MockHub {
            base,
            log: hub.log,
            behaviour: hub.behaviour,
            tasks,
            _runtime: None,
        }
    }

    pub fn requests(&self) -> Vec<Logged> {
        self.log.lock().expect("log").clone()
    }

    /// The requests for file bytes (on the hub or the CDN).
    pub fn transfers(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| !r.path.starts_with("/api/"))
            .collect()
    }
}

fn record(hub: &Hub, path: String, headers: &HeaderMap) {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    hub.log.lock().expect("log").push(Logged {
        path,
        range: text("range"),
        authorization: text("authorization"),
    });
}

fn authorized(hub: &Hub, headers: &HeaderMap) -> bool {
    let want = hub.behaviour.lock().expect("behaviour").token.clone();
    match want {
        None => true,
        Some(token) => {
            headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some(format!("Bearer {token}").as_str())
        }
    }
}

async fn listing(
    State(hub): State<Hub>,
    Path((org, repo, rev)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    record(
        &hub,
        format!("/api/models/{org}/{repo}/revision/{rev}"),
        &headers,
    );
    if !authorized(&hub, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [("x-error-code", "GatedRepo")],
            "gated",
        )
            .into_response();
    }
    let Some(files) = hub.repos.get(&format!("{org}/{repo}")) else {
        return (
            StatusCode::NOT_FOUND,
            [("x-error-code", "RepoNotFound")],
            "no such repository",
        )
            .into_response();
    };
    if rev != "main" && rev != COMMIT {
        return (
            StatusCode::NOT_FOUND,
            [("x-error-code", "RevisionNotFound")],
            "no such revision",
        )
            .into_response();
    }
    let siblings: Vec<serde_json::Value> = files
        .iter()
        .map(|f| {
            let mut s = serde_json::json!({
                "rfilename": f.name,
                "size": f.bytes.len(),
                "blobId": if f.lfs { "0".repeat(40) } else { f.blob_id() },
            });
            if f.lfs {
                s["lfs"] = serde_json::json!({
                    "sha256": f.sha256(),
                    "size": f.bytes.len(),
                    "pointerSize": 134,
                });
            }
            s
        })
        .collect();
    axum::Json(serde_json::json!({
        "id": format!("{org}/{repo}"),
        "sha": COMMIT,
        "siblings": siblings,
    }))
    .into_response()
}

async fn resolve(
    State(hub): State<Hub>,
    Path((org, repo, rev, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    record(
        &hub,
        format!("/{org}/{repo}/resolve/{rev}/{path}"),
        &headers,
    );
    let Some(file) = find(&hub, &org, &repo, &path) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if rev != COMMIT {
        return StatusCode::NOT_FOUND.into_response();
    }
    if file.lfs {
        // The real hub sends LFS files from its CDN, another origin.
        let to = format!("{}/cdn/{org}/{repo}/{path}", hub.cdn_base);
        return (StatusCode::FOUND, [("location", to)]).into_response();
    }
    serve_bytes(&hub, &file, &headers)
}

async fn cdn_file(
    State(hub): State<Hub>,
    Path((org, repo, path)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    record(&hub, format!("/cdn/{org}/{repo}/{path}"), &headers);
    match find(&hub, &org, &repo, &path) {
        Some(file) => serve_bytes(&hub, &file, &headers),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn find(hub: &Hub, org: &str, repo: &str, path: &str) -> Option<MockFile> {
    hub.repos
        .get(&format!("{org}/{repo}"))?
        .iter()
        .find(|f| f.name == path)
        .cloned()
}

/// The file's bytes from the requested range on, cut or corrupted as the behaviour
/// says.
fn serve_bytes(hub: &Hub, file: &MockFile, headers: &HeaderMap) -> Response {
    let mut bytes = file.bytes.as_ref().clone();
    let (cut, corrupt) = {
        let mut b = hub.behaviour.lock().expect("behaviour");
        (
            b.cut_first_transfer_at.remove(&file.name),
            b.corrupt.contains(&file.name),
        )
    };
    if corrupt {
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
    }
    let start = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let total = bytes.len();
    let (status, body, from) = match start {
        Some(from) if from < total => (StatusCode::PARTIAL_CONTENT, bytes[from..].to_vec(), from),
        Some(_) => return StatusCode::RANGE_NOT_SATISFIABLE.into_response(),
        None => (StatusCode::OK, bytes, 0),
    };
    let len = body.len();
    let mut response = match cut {
        Some(at) if at < len => {
            // Part of the body, then the connection breaks.
            let first = Bytes::from(body[..at].to_vec());
            let stream = futures_util::stream::iter(vec![
                Ok::<Bytes, std::io::Error>(first),
                Err(std::io::Error::other("connection cut")),
            ]);
            Response::new(Body::from_stream(stream))
        }
        _ => Response::new(Body::from(body)),
    };
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert("content-length", len.into());
    h.insert("accept-ranges", "bytes".parse().expect("header"));
    if status == StatusCode::PARTIAL_CONTENT {
        let range = format!("bytes {from}-{}/{total}", total - 1);
        h.insert("content-range", range.parse().expect("header"));
    }
    response
}
