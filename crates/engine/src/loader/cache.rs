//! Where `scripts/fetch-model` puts the default model (the rule of scripts/lib.sh).

use std::path::PathBuf;

/// File name of the default model: SmolLM2-135M-Instruct, GGUF Q4_1.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$TESSERA_CACHE_DIR`, else `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("tessera");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    PathBuf::from(home).join(".cache/tessera")
}

/// The default model in the cache (which may not have been fetched yet).
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL_FILE)
}
