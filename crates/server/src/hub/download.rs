//! One file from the hub into the cache: resumed from what an earlier attempt left, its
//! digest checked against the hub's before it becomes a blob, then linked into the
//! snapshot.
//!
//! The bytes gather in `blobs/<etag>.incomplete`. A transfer that breaks is resumed with
//! a range request from the bytes already there (in this run, up to [`ATTEMPTS`] times;
//! a later run picks the file up too, as `huggingface_hub` does). Only a file whose size
//! and digest match what the hub lists is renamed to its blob: a corrupt one is deleted
//! and refused, so nothing unchecked is ever loaded.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;

use crate::hub::cache::RepoCache;
use crate::hub::checksum::Hasher;
use crate::hub::client::{transfer, HubClient, RepoFile};
use crate::hub::error::HubError;
use crate::hub::progress::Progress;
use crate::hub::reference::ModelRef;

/// Transfers of one file in one run before it fails.
pub const ATTEMPTS: u32 = 5;

/// What one file needs to come down.
pub struct FileJob<'a> {
    pub client: &'a HubClient,
    pub cache: &'a RepoCache,
    pub model: &'a ModelRef,
    pub commit: &'a str,
    pub file: &'a RepoFile,
    pub progress_bar: bool,
}

/// The file in the snapshot, downloaded (or found in the cache) and checked.
pub async fn fetch_file(job: &FileJob<'_>) -> Result<PathBuf, HubError> {
    let FileJob {
        cache,
        commit,
        file,
        ..
    } = *job;
    if let Some(path) = cache.cached_file(commit, &file.name) {
        return Ok(path);
    }
    let blob = cache.blob(file.etag());
    if !blob.is_file() {
        download(job).await?;
    }
    cache.link(commit, &file.name, file.etag())
}

async fn download(job: &FileJob<'_>) -> Result<(), HubError> {
    let file = job.file;
    let partial = job.cache.partial(file.etag());
    if let Some(dir) = partial.parent() {
        std::fs::create_dir_all(dir).map_err(HubError::io(dir))?;
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&partial)
        .map_err(HubError::io(&partial))?;
    let mut have = out.metadata().map_err(HubError::io(&partial))?.len();
    if have > file.size {
        out.set_len(0).map_err(HubError::io(&partial))?;
        have = 0;
    }
    // The digest covers the bytes an earlier run left, read back once.
    let mut hasher = Hasher::new(&file.expected, file.size);
    hash_existing(&partial, have, &mut hasher)?;
    let mut progress = Progress::start(&file.name, file.size, have, job.progress_bar);
    let url = job.client.file_url(job.model, job.commit, &file.name);
    let mut attempt = 0;
    while have < file.size {
        attempt += 1;
        match transfer_once(job, &url, &mut out, &mut have, &mut hasher, &mut progress).await {
            Ok(()) => {}
            Err(e) if attempt < ATTEMPTS => {
                progress.interrupted(&e.to_string());
                tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
            }
            Err(e) => return Err(e),
        }
    }
    out.flush().map_err(HubError::io(&partial))?;
    drop(out);
    let actual = hasher.finish();
    if actual != file.expected.hex() || have != file.size {
        let _ = std::fs::remove_file(&partial);
        return Err(HubError::Corrupt {
            file: file.name.clone(),
            size: have,
            algorithm: file.expected.algorithm(),
            expected: file.expected.hex().to_string(),
            actual,
        });
    }
    let blob = job.cache.blob(file.etag());
    std::fs::rename(&partial, &blob).map_err(HubError::io(&blob))?;
    progress.finish(file.expected.algorithm());
    Ok(())
}

/// One request: appends what arrives to `out` until the file is whole or the transfer
/// breaks (an error, after which the caller resumes from `have`).
async fn transfer_once(
    job: &FileJob<'_>,
    url: &str,
    out: &mut std::fs::File,
    have: &mut u64,
    hasher: &mut Hasher,
    progress: &mut Progress,
) -> Result<(), HubError> {
    let mut response = job.client.open(url, *have).await?;
    match response.status() {
        StatusCode::PARTIAL_CONTENT => {
            let start = content_range_start(&response);
            if start != Some(*have) {
                return Err(HubError::BadAnswer {
                    url: url.to_string(),
                    message: format!(
                        "asked for bytes from {have}, got a range starting at {start:?}"
                    ),
                });
            }
        }
        _ if *have > 0 => {
            // The server sent the whole file: start over.
            out.set_len(0)
                .map_err(HubError::io(job.cache.partial(job.file.etag())))?;
            *have = 0;
            *hasher = Hasher::new(&job.file.expected, job.file.size);
            progress.restart();
        }
        _ => {}
    }
    while let Some(chunk) = response.chunk().await.map_err(|e| transfer(url, &e))? {
        let room = job.file.size - *have;
        if chunk.len() as u64 > room {
            return Err(HubError::BadAnswer {
                url: url.to_string(),
                message: format!("more than the {} bytes the hub lists", job.file.size),
            });
        }
        out.write_all(&chunk)
            .map_err(HubError::io(job.cache.partial(job.file.etag())))?;
        hasher.update(&chunk);
        *have += chunk.len() as u64;
        progress.advance(chunk.len() as u64);
    }
    if *have < job.file.size {
        return Err(HubError::Transfer {
            url: url.to_string(),
            message: format!("the transfer ended after {have} of {} bytes", job.file.size),
        });
    }
    Ok(())
}

/// The first byte of a 206's `Content-Range: bytes START-END/TOTAL`.
fn content_range_start(response: &reqwest::Response) -> Option<u64> {
    let value = response
        .headers()
        .get(reqwest::header::CONTENT_RANGE)?
        .to_str()
        .ok()?;
    let range = value.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

/// Feeds the first `len` bytes of `path` to `hasher`.
fn hash_existing(path: &std::path::Path, len: u64, hasher: &mut Hasher) -> Result<(), HubError> {
    if len == 0 {
        return Ok(());
    }
    let file = std::fs::File::open(path).map_err(HubError::io(path))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file.take(len));
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(HubError::io(path))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}
