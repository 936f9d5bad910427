//! Where the hub is, who asks, whether to ask at all and where files go: read once from
//! the environment with the names and defaults of Hugging Face's own client
//! (`huggingface_hub`), so one cache and one token serve both.

use std::path::PathBuf;

/// The public hub, when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Debug, Clone)]
pub struct HubSettings {
    /// `HF_ENDPOINT`: the hub's base URL, without a trailing `/`.
    pub endpoint: String,
    /// `HF_TOKEN`, else the file `huggingface-cli login` writes (`HF_TOKEN_PATH`, else
    /// `$HF_HOME/token`). Sent as a bearer token to the hub only.
    pub token: Option<String>,
    /// `HF_HUB_OFFLINE=1`: no request at all; models come from the cache or not at all.
    pub offline: bool,
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    /// `~/.cache/huggingface/hub`.
    pub cache_dir: PathBuf,
    /// Draw a progress bar (standard error is a terminal) rather than log progress lines.
    pub progress_bar: bool,
}

impl HubSettings {
    /// The settings from the variables `get` reads (the process environment, or a
    /// test's).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let set = |name: &str| get(name).filter(|v| !v.is_empty());
        let home = set("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
        let hf_home = set("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            set("XDG_CACHE_HOME")
                .map_or_else(|| home.join(".cache"), PathBuf::from)
                .join("huggingface")
        });
        let cache_dir = set("HF_HUB_CACHE").map_or_else(|| hf_home.join("hub"), PathBuf::from);
        let token_file = set("HF_TOKEN_PATH").map_or_else(|| hf_home.join("token"), PathBuf::from);
        let token = set("HF_TOKEN")
            .or_else(|| set("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| std::fs::read_to_string(token_file).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let endpoint = set("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
            .trim_end_matches('/')
            .to_string();
        let offline = set("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v));
        HubSettings {
            endpoint,
            token,
            offline,
            cache_dir,
            progress_bar: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        }
    }

    /// The settings of this process's environment.
    pub fn from_process_env() -> Self {
        Self::from_env(|name| std::env::var(name).ok())
    }
}

/// `huggingface_hub`'s reading of a boolean variable.
fn is_true(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_uppercase().as_str(),
        "1" | "ON" | "YES" | "TRUE"
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> HubSettings {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubSettings::from_env(|k| vars.get(k).cloned())
    }

    #[test]
    fn defaults_follow_the_hub_client() {
        let s = settings(&[("HOME", "/home/u")]);
        assert_eq!(s.endpoint, "https://huggingface.co");
        assert_eq!(s.cache_dir, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert!(!s.offline);
        assert_eq!(s.token, None);
    }

    #[test]
    fn variables_override_them() {
        let s = settings(&[
            ("HOME", "/home/u"),
            ("HF_HOME", "/data/hf"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_TOKEN", " hf_abc\n"),
            ("HF_HUB_OFFLINE", "yes"),
        ]);
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert_eq!(s.cache_dir, PathBuf::from("/data/hf/hub"));
        assert_eq!(s.token.as_deref(), Some("hf_abc"));
        assert!(s.offline);
        let s = settings(&[("HF_HUB_CACHE", "/c"), ("HF_HUB_OFFLINE", "0")]);
        assert_eq!(s.cache_dir, PathBuf::from("/c"));
        assert!(!s.offline);
    }
}
