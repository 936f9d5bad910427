//! Phi-3 and Phi-4-mini (`Phi3ForCausalLM`; GGUF `phi3`): llama's layer with fused
//! query/key/value and gate/up projections (read as their parts by the loader), part of
//! each head rotating where `partial_rotary_factor` says (Phi-4-mini: 96 of 128), with
//! LongRoPE for long contexts; Phi-3 mini 4k attends to its last 2047 positions in every
//! layer.

use crate::error::Result;
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::families::row::{HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};

static PHI3: Family = Family {
    name: "phi3",
    hf_names: &["phi3", "Phi3ForCausalLM"],
    gguf_names: &["phi3"],
    tensors: TensorNames {
        gguf_fused_gate_up: true,
        ..TensorNames::LLAMA
    },
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &PHI3,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: None,
    from_hf,
    from_gguf,
    fixture: "tiny-phi3",
};

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    hf.window_in_every_layer(config);
    Ok(())
}

/// Its files state no key length: the head is hidden / heads, and
/// `rope.dimension_count` its rotated part.
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    config.head_dim = config.hidden_size / config.num_heads.max(1);
    config.rotary_dim = gguf
        .usize_opt("rope.dimension_count")?
        .unwrap_or(config.head_dim);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EngineError;
    use crate::spec::rope::RopeScaling;
    use serde_json::json;

    /// Phi-3-mini-4k's shape: a window of 2047 positions in every layer.
    fn phi3(extra: serde_json::Value) -> Result<ModelConfig> {
        crate::families::hf::read(
            json!({
                "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064,
                "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32,
                "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
                "rope_theta": 10000.0, "rope_scaling": null, "sliding_window": 2047,
            }),
            extra,
        )
    }

    #[test]
    fn phi3_attends_within_its_window_and_rotates_whole_heads() -> Result<()> {
        let c = phi3(json!({}))?;
        assert_eq!((c.family.name, c.head_dim), ("phi3", 96));
        let window = c.sliding_window.expect("window");
        assert_eq!(window.window, 2047);
        assert!(window.layers.iter().all(|l| *l));
        // Phi-4: no window.
        assert!(phi3(json!({"sliding_window": null}))?
            .sliding_window
            .is_none());
        assert_eq!(c.rotary_dim, 96);
        // A share of the head that leaves an odd number of dimensions is refused.
        match phi3(json!({"partial_rotary_factor": 0.7})) {
            Err(EngineError::Config(m)) => assert!(m.contains("partial_rotary_factor"), "{m}"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    /// Phi-4-mini's config.json (transformers-4 layout): three quarters of each head of 128
    /// rotate, with LongRoPE factors for those 48 pairs over a pretraining context of 4096
    /// stretched to 131072.
    #[test]
    fn phi4_mini_rotates_part_of_each_head_with_longrope() -> Result<()> {
        let factors = |v: f64| json!(vec![v; 48]);
        let c = phi3(json!({
            "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
            "max_position_embeddings": 131072, "partial_rotary_factor": 0.75,
            "sliding_window": 262144,
            "rope_scaling": {"type": "longrope", "long_factor": factors(2.0),
                             "short_factor": factors(1.0)},
        }))?;
        assert_eq!((c.head_dim, c.rotary_dim), (128, 96));
        let RopeScaling::LongRope(l) = &c.rope_scaling else {
            panic!("{:?}", c.rope_scaling)
        };
        assert_eq!(l.original_context, 4096.0);
        // sqrt(1 + ln(32) / ln(4096)), as transformers computes it.
        assert!((l.attention_factor - (1.0f64 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-12);
        assert!(c.sliding_window.is_none());
        // transformers 5 keeps the share and the pretraining context in rope_parameters.
        let t5 = phi3(json!({
            "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
            "max_position_embeddings": 131072, "original_max_position_embeddings": null, "rope_theta": null,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.75,
                                "original_max_position_embeddings": 4096,
                                "long_factor": factors(2.0), "short_factor": factors(1.0)},
        }))?;
        assert_eq!((t5.rotary_dim, &t5.rope_scaling), (96, &c.rope_scaling));
        // Factors for the whole head are refused by name.
        match phi3(json!({
            "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
            "partial_rotary_factor": 0.75, "rope_scaling": {"type": "longrope", "long_factor": factors(2.0),
                             "short_factor": vec![1.0; 64]},
        })) {
            Err(EngineError::Config(m)) => assert!(m.contains("short_factor holds 64"), "{m}"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }
}
