//! Mixtral (`MixtralForCausalLM`): llama's layer with a mixture of experts in every
//! layer under `block_sparse_moe` names, the router's top choices always renormalised,
//! attending to its last `sliding_window` positions where it says. It has no GGUF name of
//! its own: llama.cpp's converter writes it as a `llama` file with stacked experts, which
//! `llama.rs` reads with [`GGUF_EXPERTS`].

use crate::error::{EngineError, Result};
use crate::families::hf_config::HfConfig;
use crate::families::row::{nothing_more_gguf, GgufExperts, GgufRouter, HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};
use crate::spec::moe::{ExpertNames, MoeConfig, MoeFields};

static MIXTRAL: Family = Family {
    name: "mixtral",
    hf_names: &["mixtral", "MixtralForCausalLM"],
    gguf_names: &[],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

/// Mixtral's experts in a `llama` file, as llama.cpp's converter writes them: stacked,
/// their width the dense `llama.feed_forward_length` where no expert width is stated.
pub(super) const GGUF_EXPERTS: GgufExperts = GgufExperts {
    names: ExpertNames::Mixtral,
    router: GgufRouter::Softmax,
    shared_expert: false,
    clamped_with_biases: None,
    in_dense_files: true,
};

pub(super) static ROW: Row = Row {
    family: &MIXTRAL,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    // Its files are llama's.
    gguf_rope_style: RopeStyle::Interleaved,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: Some(GGUF_EXPERTS),
    from_hf,
    from_gguf: nothing_more_gguf,
    fixture: "tiny-mixtral",
};

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    config.moe = Some(experts(hf)?);
    hf.window_in_every_layer(config);
    Ok(())
}

/// Mixtral: every layer a mixture of `num_local_experts` experts of
/// `intermediate_size`, the top `num_experts_per_tok` of the router's softmax always
/// renormalised to sum 1 (transformers' `MixtralSparseMoeBlock` has no switch for it).
fn experts(hf: &HfConfig) -> Result<MoeConfig> {
    let fail = |m: String| Err(EngineError::Config(m));
    hf.check_router_scoring("mixtral")?;
    let Some(num_experts) = hf.num_local_experts else {
        return fail("mixtral: num_local_experts is missing".into());
    };
    let Some(top_k) = hf.num_experts_per_tok else {
        return fail("mixtral: num_experts_per_tok is missing".into());
    };
    Ok(MoeConfig {
        num_experts,
        top_k,
        intermediate_size: hf.intermediate_size,
        norm_topk_prob: true,
        layers: vec![true; hf.num_hidden_layers],
        names: ExpertNames::Mixtral,
        biases: false,
        clamped_swiglu: None,
        sigmoid_router: None,
        shared_intermediate_size: None,
        fields: MoeFields::new(
            "num_local_experts",
            "num_experts_per_tok",
            "intermediate_size",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::moe::ExpertTensor;

    fn mixtral(change: serde_json::Value) -> Result<ModelConfig> {
        crate::families::hf::read(
            serde_json::json!({
                "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "vocab_size": 512, "hidden_size": 64, "intermediate_size": 38,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "num_local_experts": 5, "num_experts_per_tok": 2,
                "sliding_window": null, "router_jitter_noise": 0.0,
                "max_position_embeddings": 512,
            }),
            change,
        )
    }

    fn refused_by_field(result: Result<ModelConfig>, field: &str, case: &serde_json::Value) {
        match result {
            Err(EngineError::Config(m)) => assert!(m.contains(field), "{case}: {m}"),
            other => panic!("{case}: {other:?}"),
        }
    }

    #[test]
    fn mixtral_is_a_mixture_in_every_layer_with_renormalised_routing() -> Result<()> {
        let c = mixtral(serde_json::json!({}))?;
        let moe = c.moe.clone().expect("moe");
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.intermediate_size),
            (5, 2, 38)
        );
        assert_eq!(moe.layers, vec![true, true]);
        assert_eq!(moe.names, ExpertNames::Mixtral);
        assert!(moe.norm_topk_prob && !c.qk_norm && !c.attention_bias);
        assert_eq!(c.family.name, "mixtral");
        assert_eq!(
            moe.names.tensor(1, ExpertTensor::Down(3)),
            "model.layers.1.block_sparse_moe.experts.3.w2.weight"
        );
        // A window as long as the context is no window; a shorter one slides in every layer.
        assert_eq!(
            mixtral(serde_json::json!({"sliding_window": 512}))?.sliding_window,
            None
        );
        let window = mixtral(serde_json::json!({"sliding_window": 64}))?
            .sliding_window
            .expect("a window");
        assert_eq!((window.window, window.layers), (64, vec![true, true]));
        Ok(())
    }

    #[test]
    fn bad_mixtral_configs_are_refused_by_field() {
        for (change, field) in [
            (
                serde_json::json!({"num_experts_per_tok": 6}),
                "num_experts_per_tok",
            ),
            (
                serde_json::json!({"num_experts_per_tok": null}),
                "num_experts_per_tok",
            ),
            (
                serde_json::json!({"num_local_experts": 0}),
                "num_local_experts",
            ),
            (
                serde_json::json!({"num_local_experts": null}),
                "num_local_experts",
            ),
            (
                serde_json::json!({"intermediate_size": 0}),
                "intermediate_size",
            ),
            (
                serde_json::json!({"scoring_func": "sigmoid"}),
                "scoring_func",
            ),
            (serde_json::json!({"hidden_act": "gelu"}), "hidden_act"),
        ] {
            refused_by_field(mixtral(change.clone()), field, &change);
        }
    }
}
