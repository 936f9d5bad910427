//! One repository's folder in the Hugging Face cache, in the layout `huggingface_hub`
//! writes and reads, so a model downloaded by either is found by the other:
//!
//! ```text
//! models--org--repo/
//!   refs/main                       the commit the branch `main` pointed at
//!   blobs/<sha256 or git sha1>      each file's bytes once, named by its hub etag
//!   blobs/<etag>.incomplete         a download in progress, resumed from its length
//!   snapshots/<commit>/<file>       a relative link to its blob
//! ```

use std::path::{Path, PathBuf};

use crate::hub::error::HubError;

#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
}

impl RepoCache {
    /// The folder `folder_name` (`models--org--repo`) under `cache_dir`.
    pub fn new(cache_dir: &Path, folder_name: &str) -> Self {
        RepoCache {
            root: cache_dir.join(folder_name),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    /// Where the bytes of `etag` gather until they are checked.
    pub fn partial(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(format!("{etag}.incomplete"))
    }

    /// Records that `revision` (a branch or tag) is at `commit`.
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        if revision == commit {
            return Ok(());
        }
        let path = self.root.join("refs").join(revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(HubError::io(dir))?;
        }
        std::fs::write(&path, commit).map_err(HubError::io(&path))
    }

    /// The commit `revision` was at when last downloaded (a commit names itself once
    /// its snapshot exists).
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if let Ok(commit) = std::fs::read_to_string(self.root.join("refs").join(revision)) {
            return Some(commit.trim().to_string());
        }
        let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
        (is_commit && self.snapshot(revision).is_dir()).then(|| revision.to_string())
    }

    /// Links `snapshots/<commit>/<file>` to the blob `etag` (relative, so the cache can
    /// move), replacing an older link.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf, HubError> {
        let link = self.snapshot(commit).join(file);
        if let Some(dir) = link.parent() {
            std::fs::create_dir_all(dir).map_err(HubError::io(dir))?;
        }
        // From snapshots/<commit>/<folders...>/ back up to the repository folder.
        let depth = file.matches('/').count() + 2;
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(HubError::io(&link)(e)),
        }
        std::os::unix::fs::symlink(&target, &link).map_err(HubError::io(&link))?;
        Ok(link)
    }

    /// `file` of the snapshot at `commit`, when its bytes are there.
    pub fn cached_file(&self, commit: &str, file: &str) -> Option<PathBuf> {
        let path = self.snapshot(commit).join(file);
        // `is_file` follows the link: a link to a missing blob is no file.
        path.is_file().then_some(path)
    }

    /// The files of the snapshot at `commit`, as repository paths (`a/b.gguf`).
    pub fn snapshot_files(&self, commit: &str) -> Vec<String> {
        let root = self.snapshot(commit);
        let mut files = Vec::new();
        let mut folders = vec![root.clone()];
        while let Some(folder) = folders.pop() {
            let Ok(entries) = std::fs::read_dir(&folder) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.is_file() {
                    if let Some(name) = path.strip_prefix(&root).ok().and_then(Path::to_str) {
                        files.push(name.to_string());
                    }
                }
            }
        }
        files.sort();
        files
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn links_point_at_blobs_and_refs_name_commits() {
        let dir = std::env::temp_dir().join(format!("tessera-hub-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = RepoCache::new(&dir, "models--org--repo");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(cache.blob("x").parent().unwrap()).unwrap();
        std::fs::write(cache.blob("e1"), b"one").unwrap();
        std::fs::write(cache.blob("e2"), b"two").unwrap();
        cache.link(commit, "a.json", "e1").unwrap();
        let nested = cache.link(commit, "sub/b.gguf", "e2").unwrap();
        assert_eq!(
            std::fs::read_link(&nested).unwrap(),
            PathBuf::from("../../../blobs/e2")
        );
        assert_eq!(std::fs::read(&nested).unwrap(), b"two");
        assert_eq!(cache.snapshot_files(commit), ["a.json", "sub/b.gguf"]);
        assert!(cache.cached_file(commit, "missing").is_none());
        assert_eq!(cache.commit_of("main"), None);
        cache.write_ref("main", commit).unwrap();
        assert_eq!(cache.commit_of("main").as_deref(), Some(commit));
        assert_eq!(cache.commit_of(commit).as_deref(), Some(commit));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
