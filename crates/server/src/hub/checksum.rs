//! The digest a hub file must have. The hub lists a SHA-256 for every file stored with
//! Git LFS (weights, GGUF files, large tokenizers) and a Git blob id (SHA-1 of
//! `blob <size>\0` and the bytes) for the small files kept in Git itself, so every file
//! is checked before it is used.

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// What a file's bytes must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// Hex SHA-256 of the bytes (LFS files).
    Sha256(String),
    /// Hex Git blob id (files in Git).
    GitBlob(String),
}

impl Expected {
    pub fn algorithm(&self) -> &'static str {
        match self {
            Expected::Sha256(_) => "sha256",
            Expected::GitBlob(_) => "git blob id",
        }
    }

    pub fn hex(&self) -> &str {
        match self {
            Expected::Sha256(h) | Expected::GitBlob(h) => h,
        }
    }
}

/// A running digest of the kind [`Expected`] asks for.
pub enum Hasher {
    Sha256(Sha256),
    GitBlob(Sha1),
}

impl Hasher {
    /// A digest for a file of `size` bytes (a Git blob id hashes the size first).
    pub fn new(expected: &Expected, size: u64) -> Self {
        match expected {
            Expected::Sha256(_) => Hasher::Sha256(Sha256::new()),
            Expected::GitBlob(_) => {
                let mut h = Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                Hasher::GitBlob(h)
            }
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::GitBlob(h) => h.update(bytes),
        }
    }

    /// The lowercase hex digest.
    pub fn finish(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::GitBlob(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(expected: &Expected, bytes: &[u8]) -> String {
        let mut h = Hasher::new(expected, bytes.len() as u64);
        h.update(bytes);
        h.finish()
    }

    #[test]
    fn digests_match_sha256sum_and_git_hash_object() {
        // `printf hello | sha256sum` and `printf hello | git hash-object --stdin`.
        assert_eq!(
            digest(&Expected::Sha256(String::new()), b"hello"),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(
            digest(&Expected::GitBlob(String::new()), b"hello"),
            "b6fc4c620b67d95f953a5c1c1230aaab5db5a1b0"
        );
    }
}
