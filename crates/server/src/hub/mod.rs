//! Models by name from a Hugging Face hub, as llama-server's `-hf` and vLLM's `--model`
//! take them: `--model org/repo` (a safetensors folder), `org/repo:Q4_K_M` or
//! `org/repo:FILE.gguf` (a GGUF file; split files come with all their parts), at
//! `--revision` (default `main`).
//!
//! Files go into the Hugging Face cache in its own layout ([`cache`]), so models
//! downloaded by `huggingface_hub` are found and the other way round. Each file is
//! resumed where an earlier attempt stopped and checked against the hub's digest before
//! it is used ([`download`]). `HF_ENDPOINT`, `HF_TOKEN` and `HF_HUB_OFFLINE` are honoured
//! ([`settings`]); offline, the model comes from the cache without any request.
//!
//! The client is our own, on reqwest (what the `hf-hub` crate builds on; here with
//! rustls and bundled roots, so a slim container needs no certificate store): `hf-hub`
//! checks no digests, and its repository listing carries neither sizes nor the LFS
//! digests that resuming and checking need.

pub mod cache;
pub mod checksum;
pub mod client;
pub mod download;
pub mod error;
pub mod progress;
pub mod reference;
pub mod select;
pub mod settings;

use std::path::PathBuf;

pub use error::HubError;
pub use reference::{FileChoice, ModelRef};
pub use settings::HubSettings;

use crate::hub::cache::RepoCache;
use crate::hub::client::{HubClient, RepoFile};
use crate::hub::download::{fetch_file, FileJob};
use crate::hub::select::{plan, weights, Plan, SAFETENSORS_INDEX};

/// The local path of `model`: its GGUF file (the first part of a split one) or its
/// snapshot folder, downloaded first unless the cache has it. Blocking: it runs the
/// transfers on a runtime of its own, on a thread of its own, so it may be called from
/// anywhere (a plain thread, or the blocking pool of the server's runtime).
pub fn fetch(model: &ModelRef, settings: &HubSettings) -> Result<PathBuf, HubError> {
    let cache = RepoCache::new(&settings.cache_dir, &model.cache_folder_name());
    if settings.offline {
        return from_cache(model, settings, &cache);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(HubError::io(&settings.cache_dir))?;
                runtime.block_on(download_model(model, settings, &cache))
            })
            .join()
            .unwrap_or_else(|_| {
                Err(HubError::Transfer {
                    url: settings.endpoint.clone(),
                    message: format!("the download of `{model}` panicked"),
                })
            })
    })
}

async fn download_model(
    model: &ModelRef,
    settings: &HubSettings,
    cache: &RepoCache,
) -> Result<PathBuf, HubError> {
    let client = HubClient::new(settings)?;
    tracing::info!(
        "model {model}: asking {} for revision `{}`",
        settings.endpoint,
        model.revision
    );
    let info = client.repo_info(model).await?;
    let names: Vec<String> = info.files.iter().map(|f| f.name.clone()).collect();
    let by_name = |name: &str| -> Result<&RepoFile, HubError> {
        info.files.iter().find(|f| f.name == name).ok_or_else(|| {
            HubError::NoMatch(format!(
                "`{}` (revision `{}`) has no file `{name}`",
                model.repo, model.revision
            ))
        })
    };
    let job = |file| FileJob {
        client: &client,
        cache,
        model,
        commit: &info.commit,
        file,
        progress_bar: settings.progress_bar,
    };
    let chosen = plan(model, &names)?;
    let (path, wanted) = match &chosen {
        Plan::Gguf(files) => (cache.snapshot(&info.commit).join(&files[0]), files.clone()),
        Plan::Folder { meta } => {
            let mut index = None;
            for name in meta {
                let path = fetch_file(&job(by_name(name)?)).await?;
                if name == SAFETENSORS_INDEX {
                    index = Some(std::fs::read_to_string(&path).map_err(HubError::io(&path))?);
                }
            }
            let shards =
                weights(&names, index.as_deref()).map_err(|message| HubError::BadAnswer {
                    url: client.file_url(model, &info.commit, SAFETENSORS_INDEX),
                    message,
                })?;
            (cache.snapshot(&info.commit), shards)
        }
    };
    let total: u64 = wanted
        .iter()
        .filter_map(|n| by_name(n).ok())
        .map(|f| f.size)
        .sum();
    if wanted.len() > 1 {
        tracing::info!(
            "model {model}: {} files, {:.1} MB",
            wanted.len(),
            total as f64 / 1e6
        );
    }
    for name in &wanted {
        fetch_file(&job(by_name(name)?)).await?;
    }
    // Recorded last: offline runs trust a ref only once its files are all here.
    cache.write_ref(&model.revision, &info.commit)?;
    tracing::info!("model {model}: {} (commit {})", path.display(), info.commit);
    Ok(path)
}

/// `model` from the cache alone (offline mode): the revision's last known commit, and
/// every file the model needs there.
fn from_cache(
    model: &ModelRef,
    settings: &HubSettings,
    cache: &RepoCache,
) -> Result<PathBuf, HubError> {
    let not_cached = |missing: String| HubError::NotCached {
        model: model.to_string(),
        revision: model.revision.clone(),
        cache: settings.cache_dir.clone(),
        missing,
    };
    let commit = cache
        .commit_of(&model.revision)
        .ok_or_else(|| not_cached(String::new()))?;
    let files = cache.snapshot_files(&commit);
    let snapshot = cache.snapshot(&commit);
    let (path, needed) = match plan(model, &files).map_err(|e| not_cached(format!(" ({e})")))? {
        Plan::Gguf(parts) => (snapshot.join(&parts[0]), parts),
        Plan::Folder { .. } => {
            let index = std::fs::read_to_string(snapshot.join(SAFETENSORS_INDEX)).ok();
            let shards =
                weights(&files, index.as_deref()).map_err(|e| not_cached(format!(" ({e})")))?;
            (snapshot.clone(), shards)
        }
    };
    if let Some(missing) = needed
        .iter()
        .find(|f| cache.cached_file(&commit, f).is_none())
    {
        return Err(not_cached(format!(" (`{missing}` is missing)")));
    }
    tracing::info!(
        "model {model}: {} (offline, from the cache)",
        path.display()
    );
    Ok(path)
}
