//! `--speculative-config`, as vLLM takes it: a JSON object whose `method` says how
//! guesses are made. `ngram` (prompt lookup), `draft_model` and `mtp` (the model's own
//! multi-token-prediction layer: GLM-4.5's) are served; the EAGLE and Medusa heads are
//! refused by name. The engine makes `draft_model`'s and `mtp`'s guesses, which the
//! scheduler asks for and weighs alike.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde_json::{Map, Value};
use tessera_scheduler::{DraftModelSpeculation, NgramSpeculation, Speculation};

/// Guesses a step of up to this many decoding sequences makes (vLLM's
/// `disable_by_batch_size`); above it a step already reads each weight for many tokens.
const DEFAULT_DISABLE_BY_BATCH_SIZE: usize = 8;

/// What `--speculative-config` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculationArgs {
    pub speculation: Speculation,
    /// `draft_model`: the draft's file or folder, as `--model` takes a path.
    pub draft_model: Option<PathBuf>,
    /// `mtp`: the engine loads the model's multi-token-prediction layer.
    pub mtp: bool,
}

/// The speculation `text` asks for (`None` when no config is given).
pub fn speculation(text: Option<&str>) -> Result<Option<SpeculationArgs>> {
    let Some(text) = text else {
        return Ok(None);
    };
    let value: Value = serde_json::from_str(text)
        .map_err(|e| anyhow::anyhow!("--speculative-config is not JSON: {e}"))?;
    let Value::Object(config) = value else {
        bail!("--speculative-config must be a JSON object");
    };
    let method = config.get("method").and_then(Value::as_str);
    let known: &[&str] = match method {
        Some("ngram") => &[
            "method",
            "num_speculative_tokens",
            "prompt_lookup_min",
            "prompt_lookup_max",
            "disable_by_batch_size",
        ],
        Some("draft_model") => &[
            "method",
            "model",
            "num_speculative_tokens",
            "disable_by_batch_size",
        ],
        Some("mtp") => &["method", "num_speculative_tokens", "disable_by_batch_size"],
        Some(m @ ("eagle" | "eagle3" | "medusa")) => bail!(
            "--speculative-config: method `{m}` is not served by this server; `ngram`, \
             `draft_model` and `mtp` are"
        ),
        Some(other) => bail!(
            "--speculative-config: unknown method `{other}` (use `ngram`, `draft_model` or \
             `mtp`)"
        ),
        None => {
            bail!("--speculative-config: `method` is required (`ngram`, `draft_model` or `mtp`)")
        }
    };
    let method = method.unwrap_or_default();
    if let Some(unknown) = config.keys().find(|k| !known.contains(&k.as_str())) {
        bail!(
            "--speculative-config: `{unknown}` is not a field of the {method} method (fields: {})",
            known.join(", ")
        );
    }
    let k = count(&config, "num_speculative_tokens")?.ok_or_else(|| {
        anyhow::anyhow!("--speculative-config: `num_speculative_tokens` is required")
    })?;
    let disable_by_batch_size =
        count(&config, "disable_by_batch_size")?.unwrap_or(DEFAULT_DISABLE_BY_BATCH_SIZE);
    // The engine's guesses (a draft model's, or the model's own MTP layer's): made after
    // each step that asks for them.
    let by_engine = Speculation::DraftModel(DraftModelSpeculation {
        num_speculative_tokens: k,
        disable_by_batch_size,
    });
    let (speculation, draft_model) = match method {
        "draft_model" => {
            let model = match config.get("model") {
                Some(Value::String(path)) if !path.is_empty() => PathBuf::from(path),
                Some(v) => bail!("--speculative-config: `model` must be a path, not {v}"),
                None => bail!("--speculative-config: `model` is required for draft_model"),
            };
            (by_engine, Some(model))
        }
        "mtp" => (by_engine, None),
        _ => {
            let max = count(&config, "prompt_lookup_max")?;
            let min = count(&config, "prompt_lookup_min")?;
            // vLLM's defaults: one bound given sets the other.
            let (min, max) = match (min, max) {
                (None, None) => (1, 4),
                (Some(min), None) => (min, min.max(4)),
                (None, Some(max)) => (1.min(max), max),
                (Some(min), Some(max)) => (min, max),
            };
            let spec = NgramSpeculation {
                num_speculative_tokens: k,
                prompt_lookup_min: min,
                prompt_lookup_max: max,
                disable_by_batch_size,
            };
            (Speculation::Ngram(spec), None)
        }
    };
    speculation
        .check()
        .map_err(|e| anyhow::anyhow!("--speculative-config: {e}"))?;
    Ok(Some(SpeculationArgs {
        speculation,
        draft_model,
        mtp: method == "mtp",
    }))
}

fn count(config: &Map<String, Value>, key: &str) -> Result<Option<usize>> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => bail!("--speculative-config: `{key}` must be a non-negative integer, not {v}"),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ngram_is_read_with_vllms_defaults() {
        let ngram = |text| match speculation(Some(text)).unwrap().unwrap().speculation {
            Speculation::Ngram(s) => s,
            other => panic!("{other:?}"),
        };
        let s = ngram(r#"{"method": "ngram", "num_speculative_tokens": 5}"#);
        assert_eq!(
            (
                s.num_speculative_tokens,
                s.prompt_lookup_min,
                s.prompt_lookup_max
            ),
            (5, 1, 4)
        );
        assert_eq!(s.disable_by_batch_size, DEFAULT_DISABLE_BY_BATCH_SIZE);
        let s = ngram(
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                "prompt_lookup_max": 5, "disable_by_batch_size": 4}"#,
        );
        assert_eq!(
            (
                s.prompt_lookup_min,
                s.prompt_lookup_max,
                s.disable_by_batch_size
            ),
            (2, 5, 4)
        );
        assert_eq!(speculation(None).unwrap(), None);
    }

    #[test]
    fn draft_model_names_its_model() {
        let s = speculation(Some(
            r#"{"method": "draft_model", "model": "/m/draft.gguf", "num_speculative_tokens": 4}"#,
        ))
        .unwrap()
        .unwrap();
        assert_eq!(s.draft_model, Some(PathBuf::from("/m/draft.gguf")));
        assert_eq!(
            s.speculation,
            Speculation::DraftModel(DraftModelSpeculation {
                num_speculative_tokens: 4,
                disable_by_batch_size: DEFAULT_DISABLE_BY_BATCH_SIZE,
            })
        );
    }

    #[test]
    fn mtp_guesses_as_a_draft_model_does() {
        let s = speculation(Some(r#"{"method": "mtp", "num_speculative_tokens": 2}"#))
            .unwrap()
            .unwrap();
        assert!(s.mtp);
        assert_eq!(s.draft_model, None);
        assert_eq!(
            s.speculation,
            Speculation::DraftModel(DraftModelSpeculation {
                num_speculative_tokens: 2,
                disable_by_batch_size: DEFAULT_DISABLE_BY_BATCH_SIZE,
            })
        );
    }

    #[test]
    fn a_bad_config_names_its_field() {
        for (text, names) in [
            ("[1]", "JSON object"),
            ("{", "not JSON"),
            (r#"{"num_speculative_tokens": 3}"#, "`method`"),
            (
                r#"{"method": "draft_model", "num_speculative_tokens": 3}"#,
                "`model` is required",
            ),
            (
                r#"{"method": "draft_model", "model": 3, "num_speculative_tokens": 3}"#,
                "`model` must be a path",
            ),
            (
                r#"{"method": "draft_model", "model": "x", "num_speculative_tokens": 3, "prompt_lookup_max": 3}"#,
                "`prompt_lookup_max` is not a field of the draft_model method",
            ),
            (
                r#"{"method": "draft_model", "model": "x", "num_speculative_tokens": 17}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method": "eagle", "num_speculative_tokens": 1}"#,
                "eagle",
            ),
            (
                r#"{"method": "mtp", "num_speculative_tokens": 1, "model": "x"}"#,
                "`model` is not a field of the mtp method",
            ),
            (r#"{"method": "mtp"}"#, "num_speculative_tokens"),
            (r#"{"method": "lookahead"}"#, "lookahead"),
            (r#"{"method": "ngram"}"#, "num_speculative_tokens"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": -2}"#,
                "num_speculative_tokens",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}"#,
                "prompt_lookup_min",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}"#,
                "`model`",
            ),
        ] {
            let err = speculation(Some(text)).unwrap_err().to_string();
            assert!(err.contains(names), "{text}: {err}");
        }
    }
}
