//! OLMo 3 (`Olmo3ForCausalLM`): OLMo 2's layer (no input norms, norms after attention and
//! the MLP, query and key norms across all heads) with a window of `sliding_window`
//! positions in the layers `layer_types` marks (by default three of every four, every
//! fourth attending to the whole context), each kind of layer with its own RoPE. Defaults
//! are transformers' `Olmo3Config`'s. It has no GGUF name of its own: llama.cpp's
//! converter writes it as an `olmo2` file with a window, which `olmo2.rs` reads.

use crate::error::{EngineError, Result};
use crate::families::hf_config::HfConfig;
use crate::families::olmo2;
use crate::families::row::{nothing_more_gguf, HfDefaults, Row};
use crate::spec::family::Family;
use crate::spec::model::{ModelConfig, RopeStyle, SlidingWindow};
use crate::spec::rope::RopeScaling;

static OLMO3: Family = Family {
    name: "olmo3",
    hf_names: &["olmo3", "Olmo3ForCausalLM"],
    gguf_names: &[],
    tensors: olmo2::TENSORS,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &OLMO3,
    layer: olmo2::LAYER,
    hf_rope_style: RopeStyle::Half,
    // Its files are OLMo 2's.
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: None,
    from_hf: layers,
    from_gguf: nothing_more_gguf,
    fixture: "tiny-olmo3",
};

/// transformers' defaults for OLMo 3.
const DEFAULT_WINDOW: usize = 4096;
const FULL_LAYER_EVERY: usize = 4;

/// OLMo 3's windows and RoPE on `config` (read as OLMo 2's). transformers 5 gives
/// `rope_parameters` per layer type; transformers 4 `rope_theta` for both kinds and
/// `rope_scaling` (OLMo 3's YaRN) for the full-attention layers only, which the base
/// reading has already put on the model.
fn layers(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    let n = hf.num_hidden_layers;
    let full = (config.rope_theta, config.rope_scaling.clone());
    let sliding = (config.rope_theta, RopeScaling::None);
    let [full, sliding] = hf.layer_type_ropes("olmo3", [full, sliding])?;
    config.rope_theta = full.0;
    config.rope_scaling = full.1;
    let layers = match hf.sliding_layer_types()? {
        Some(layers) if layers.len() != n => {
            return Err(EngineError::Config(format!(
                "layer_types lists {} layers of a {n}-layer model",
                layers.len()
            )))
        }
        Some(layers) => layers,
        None => (0..n).map(|l| (l + 1) % FULL_LAYER_EVERY != 0).collect(),
    };
    let window = hf.sliding_window.unwrap_or(DEFAULT_WINDOW);
    if layers.contains(&true) && window < hf.max_position_embeddings {
        config.sliding_window = Some(SlidingWindow {
            window,
            layers,
            rope_theta: sliding.0,
            rope_scaling: sliding.1,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{EngineError, Result};

    fn olmo3(change: serde_json::Value) -> Result<ModelConfig> {
        crate::families::hf::read(
            serde_json::json!({
                "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3",
                "vocab_size": 512, "hidden_size": 128, "intermediate_size": 96,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 65536, "rope_theta": 500000.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                 "original_max_position_embeddings": 8192},
                "sliding_window": 4096,
            }),
            change,
        )
    }

    /// OLMo-3-7B's transformers 4 layout: YaRN on the full layers, plain RoPE with the
    /// same base on the sliding ones, every fourth layer full.
    #[test]
    fn olmo3_slides_three_layers_in_four_with_yarn_on_the_full_ones() -> Result<()> {
        let c = olmo3(serde_json::json!({}))?;
        assert!(c.qk_norm && c.qk_norm_across_heads && !c.input_norms && c.sandwich_norms);
        assert!(matches!(c.rope_scaling, RopeScaling::Yarn(_)));
        let sw = c.sliding_window.expect("a window");
        assert_eq!(sw.window, 4096);
        assert_eq!(sw.layers, vec![true, true, true, false]);
        assert_eq!(
            (sw.rope_theta, &sw.rope_scaling),
            (500000.0, &RopeScaling::None)
        );
        // transformers 5's layout: RoPE per layer type.
        let c = olmo3(serde_json::json!({
            "rope_theta": null, "rope_scaling": null,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                            "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 2000.0}},
        }))?;
        assert_eq!(
            (c.rope_theta, &c.rope_scaling),
            (1000.0, &RopeScaling::None)
        );
        let sw = c.sliding_window.expect("a window");
        assert_eq!(
            (sw.layers, sw.rope_theta),
            (vec![true, false, true, false], 2000.0)
        );
        Ok(())
    }

    #[test]
    fn bad_olmo3_layer_types_are_refused() {
        for change in [
            serde_json::json!({"layer_types": ["sliding_attention"]}),
            serde_json::json!({"layer_types": ["sliding_attention", "full_attention",
                                               "chunked_attention", "full_attention"]}),
        ] {
            match olmo3(change.clone()) {
                Err(EngineError::Config(m)) => assert!(m.contains("layer_types"), "{change}: {m}"),
                other => panic!("{change}: {other:?}"),
            }
        }
    }
}
