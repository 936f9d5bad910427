//! Where the accepted API keys come from: `--api-key` (or `TESSERA_API_KEY`,
//! comma-separated) and `--api-key-file` (or `TESSERA_API_KEY_FILE`): one key per line,
//! blank lines and `#` comments ignored. Keys are never logged; errors about the file
//! name the file, never its contents.

use std::path::Path;

use anyhow::{Context, Result};

/// Every configured key: the flag's, then the file's. Empty means no authentication.
pub fn collect(flag_keys: &[String], file: Option<&Path>) -> Result<Vec<String>> {
    let mut keys: Vec<String> = flag_keys
        .iter()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .collect();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the API key file {}", path.display()))?;
        let from_file = parse(&text);
        if from_file.is_empty() {
            anyhow::bail!("the API key file {} holds no key", path.display());
        }
        warn_if_readable_by_others(path);
        keys.extend(from_file);
    }
    Ok(keys)
}

/// The keys of a key file's text.
fn parse(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o004 != 0 {
            tracing::warn!(
                "the API key file {} is readable by every user; consider chmod 600",
                path.display()
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn flag_and_file_keys_are_merged_and_comments_skipped() {
        let dir = std::env::temp_dir().join(format!("tessera-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys");
        std::fs::write(&path, "# ops keys\nk-file-1\n\n  k-file-2  \n").unwrap();
        let keys = collect(&["k-flag".into(), "".into()], Some(&path)).unwrap();
        assert_eq!(keys, ["k-flag", "k-file-1", "k-file-2"]);
        std::fs::write(&path, "# nothing\n").unwrap();
        let err = collect(&[], Some(&path)).unwrap_err().to_string();
        assert!(err.contains("no key"), "{err}");
        let err = format!(
            "{:#}",
            collect(&[], Some(&dir.join("missing"))).unwrap_err()
        );
        assert!(err.contains("missing"), "{err}");
    }
}
