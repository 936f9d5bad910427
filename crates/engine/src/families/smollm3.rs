//! SmolLM3 (`SmolLM3ForCausalLM`; GGUF `smollm3`): llama's layer with every fourth layer
//! adding no position embedding (its queries and keys are not rotated), and a tied head.

use crate::error::{EngineError, Result};
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::families::row::{HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};

static SMOLLM3: Family = Family {
    name: "smollm3",
    hf_names: &["smollm3", "SmolLM3ForCausalLM"],
    gguf_names: &["smollm3"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &SMOLLM3,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Interleaved,
    hf_defaults: HfDefaults {
        tie_word_embeddings: true,
        ..HfDefaults::LLAMA
    },
    gguf_experts: None,
    from_hf,
    from_gguf,
    fixture: "tiny-smollm3",
};

/// Every fourth layer adds no position embedding (`no_rope_layer_interval`; llama.cpp
/// fixes it at 4 for smollm3 files).
const NOPE_INTERVAL: usize = 4;

/// `no_rope_layers` holds 1 for a layer that rotates and 0 for one that does not
/// (transformers' naming); absent, every `no_rope_layer_interval`-th layer does not.
fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    config.nope_layers = match &hf.no_rope_layers {
        Some(rotates) if rotates.len() != hf.num_hidden_layers => {
            return Err(EngineError::Config(format!(
                "no_rope_layers lists {} layers of a {}-layer model",
                rotates.len(),
                hf.num_hidden_layers
            )))
        }
        Some(rotates) => rotates.iter().map(|r| *r == 0).collect(),
        None => every_nth_layer(
            hf.num_hidden_layers,
            hf.no_rope_layer_interval.unwrap_or(NOPE_INTERVAL),
        ),
    };
    Ok(())
}

fn from_gguf(_: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    config.nope_layers = every_nth_layer(config.num_layers, NOPE_INTERVAL);
    Ok(())
}

/// Which of `layers` layers add no position embedding when every `interval`-th does not.
fn every_nth_layer(layers: usize, interval: usize) -> Vec<bool> {
    (0..layers)
        .map(|i| interval != 0 && (i + 1) % interval == 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn smollm3_layers_without_rope() -> Result<()> {
        let smollm3 = |extra: serde_json::Value| {
            crate::families::hf::read(
                json!({
                    "model_type": "smollm3", "vocab_size": 512, "hidden_size": 64,
                    "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
                }),
                extra,
            )
        };
        let every_fourth = [false, false, false, true, false, false, false, true];
        let c = smollm3(json!({}))?;
        assert_eq!(c.nope_layers, every_fourth);
        // transformers' default for the family: a tied head.
        assert!(c.tie_word_embeddings);
        let listed = smollm3(json!({"no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0]}))?;
        assert_eq!(
            listed.nope_layers,
            [false, true, false, false, false, false, false, true]
        );
        match smollm3(json!({"no_rope_layers": [1, 0]})) {
            Err(EngineError::Config(m)) => assert!(m.contains("no_rope_layers"), "{m}"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }
}
