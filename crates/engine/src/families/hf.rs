//! A Hugging Face `config.json` read into a [`ModelConfig`]: its family found in the
//! table, what every family reads alike (sizes, RoPE, the share of each head that
//! rotates), the layer the family's row states, and then what only the family reads.

use crate::error::{EngineError, Result};
use crate::families::hf_config::HfConfig;
use crate::families::row::Row;
use crate::families::table;
use crate::spec::model::{Activation, ModelConfig};
use crate::spec::rope;

/// The family `hf` names: its `model_type`, else its first `architectures` entry.
pub(crate) fn family_row(hf: &HfConfig) -> Result<&'static Row> {
    let name = hf
        .model_type
        .as_deref()
        .or_else(|| hf.architectures.first().map(String::as_str))
        .unwrap_or_default();
    table::hf_row(name)
}

/// The model `hf` describes, as a model of `row`'s family, checked
/// ([`ModelConfig::validate`]).
pub(crate) fn model_config(hf: &HfConfig, row: &'static Row) -> Result<ModelConfig> {
    let unsupported =
        |what: String| Err(EngineError::Config(format!("{what} is not supported yet")));
    let family = row.family.name;
    // Gemma's activation is read as `hidden_activation`, by its family.
    if row.layer.activation == Activation::Silu {
        if let Some(act) = hf.hidden_act.as_deref().filter(|a| *a != "silu") {
            return unsupported(format!("hidden_act '{act}'"));
        }
    }
    if hf.use_sliding_window {
        return unsupported("sliding-window attention (use_sliding_window)".into());
    }
    if hf.mlp_bias {
        return unsupported("mlp_bias".into());
    }
    let (rope_theta, rope_scaling) =
        hf.rope(hf.rope_theta.unwrap_or(row.hf_defaults.rope_theta))?;
    let head_dim = hf
        .head_dim
        .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
    let rotary_dim = match hf.rotary_share()? {
        Some(factor) if row.layer.partial_rotation => rope::rotary_dim(head_dim, factor)?,
        Some(factor) if factor != 1.0 => {
            return unsupported(format!("partial_rotary_factor {factor} in {family}"))
        }
        _ => head_dim,
    };
    let mut config = ModelConfig {
        family: row.family,
        vocab_size: hf.vocab_size,
        hidden_size: hf.hidden_size,
        intermediate_size: hf.intermediate_size,
        num_layers: hf.num_hidden_layers,
        num_heads: hf.num_attention_heads,
        num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim,
        rotary_dim,
        rms_norm_eps: hf.rms_norm_eps,
        rope_theta,
        rope_scaling,
        rope_style: row.hf_rope_style,
        max_position_embeddings: hf.max_position_embeddings,
        attention_bias: hf.attention_bias.unwrap_or(row.hf_defaults.attention_bias),
        tie_word_embeddings: hf
            .tie_word_embeddings
            .unwrap_or(row.hf_defaults.tie_word_embeddings),
        ..ModelConfig::default()
    };
    row.layer.apply(&mut config);
    (row.from_hf)(hf, &mut config)?;
    config.validate()?;
    Ok(config)
}

/// A config.json of `base` with `change` applied, read as Tessera reads it.
#[cfg(test)]
pub(super) fn read(mut base: serde_json::Value, change: serde_json::Value) -> Result<ModelConfig> {
    if let (Some(b), Some(extra)) = (base.as_object_mut(), change.as_object()) {
        for (k, v) in extra {
            b.insert(k.clone(), v.clone());
        }
    }
    let hf: HfConfig =
        serde_json::from_value(base).map_err(|e| EngineError::Config(e.to_string()))?;
    model_config(&hf, family_row(&hf)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::rope::RopeScaling;
    use serde_json::json;

    #[test]
    fn rope_parameters_and_rope_scaling_are_both_read() -> Result<()> {
        let llama = |extra: serde_json::Value| {
            crate::families::hf::read(
                json!({
                    "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
                    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                }),
                extra,
            )
        };
        let v5 = llama(
            json!({"rope_parameters": {"rope_type": "linear", "factor": 2.0,
            "rope_theta": 5e5}}),
        )?;
        assert_eq!(
            (v5.rope_theta, v5.rope_scaling),
            (5e5, RopeScaling::Linear { factor: 2.0 })
        );
        let v4 = llama(json!({"rope_theta": 5e5, "rope_scaling": {"type": "linear",
            "factor": 4.0}}))?;
        assert_eq!(
            (v4.rope_theta, v4.rope_scaling),
            (5e5, RopeScaling::Linear { factor: 4.0 })
        );
        Ok(())
    }
}
