//! `--speculative-config`, as vLLM takes it: a JSON object whose `method` says how
//! guesses are made. `ngram` (prompt lookup) is served; `draft_model` and `mtp` are
//! refused by name until they are.

use anyhow::{bail, Result};
use serde_json::{Map, Value};
use tessera_scheduler::NgramSpeculation;

/// Guesses a step of up to this many decoding sequences makes (vLLM's
/// `disable_by_batch_size`); above it a step already reads each weight for many tokens.
const DEFAULT_DISABLE_BY_BATCH_SIZE: usize = 8;

/// The speculation `text` asks for (`None` when no config is given).
pub fn speculation(text: Option<&str>) -> Result<Option<NgramSpeculation>> {
    let Some(text) = text else {
        return Ok(None);
    };
    let value: Value = serde_json::from_str(text)
        .map_err(|e| anyhow::anyhow!("--speculative-config is not JSON: {e}"))?;
    let Value::Object(config) = value else {
        bail!("--speculative-config must be a JSON object");
    };
    let method = config.get("method").and_then(Value::as_str);
    match method {
        Some("ngram") => {}
        Some(m @ ("draft_model" | "mtp" | "eagle" | "eagle3" | "medusa")) => {
            bail!("--speculative-config: method `{m}` is not served by this server; `ngram` is")
        }
        Some(other) => bail!("--speculative-config: unknown method `{other}` (use `ngram`)"),
        None => bail!("--speculative-config: `method` is required (`ngram`)"),
    }
    let known = [
        "method",
        "num_speculative_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "disable_by_batch_size",
    ];
    if let Some(unknown) = config.keys().find(|k| !known.contains(&k.as_str())) {
        bail!(
            "--speculative-config: `{unknown}` is not a field of the ngram method (fields: {})",
            known.join(", ")
        );
    }
    let k = count(&config, "num_speculative_tokens")?.ok_or_else(|| {
        anyhow::anyhow!("--speculative-config: `num_speculative_tokens` is required")
    })?;
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
        disable_by_batch_size: count(&config, "disable_by_batch_size")?
            .unwrap_or(DEFAULT_DISABLE_BY_BATCH_SIZE),
    };
    spec.check()
        .map_err(|e| anyhow::anyhow!("--speculative-config: {e}"))?;
    Ok(Some(spec))
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
        let s = speculation(Some(r#"{"method": "ngram", "num_speculative_tokens": 5}"#))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                s.num_speculative_tokens,
                s.prompt_lookup_min,
                s.prompt_lookup_max
            ),
            (5, 1, 4)
        );
        assert_eq!(s.disable_by_batch_size, DEFAULT_DISABLE_BY_BATCH_SIZE);
        let s = speculation(Some(
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                "prompt_lookup_max": 5, "disable_by_batch_size": 4}"#,
        ))
        .unwrap()
        .unwrap();
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
    fn a_bad_config_names_its_field() {
        for (text, names) in [
            ("[1]", "JSON object"),
            ("{", "not JSON"),
            (r#"{"num_speculative_tokens": 3}"#, "`method`"),
            (
                r#"{"method": "draft_model", "model": "x", "num_speculative_tokens": 3}"#,
                "draft_model",
            ),
            (r#"{"method": "mtp", "num_speculative_tokens": 1}"#, "mtp"),
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
