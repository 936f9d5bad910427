//! Mixtral (`MixtralForCausalLM`) from a Hugging Face `config.json`: the llama layer with a
//! mixture of experts in every layer, under `block_sparse_moe` names.

use crate::error::{EngineError, Result};
use crate::families::hf_config::HfConfig;
use crate::spec::moe::{ExpertNames, MoeConfig, MoeFields};

impl HfConfig {
    /// Mixtral: every layer a mixture of `num_local_experts` experts of
    /// `intermediate_size`, the top `num_experts_per_tok` of the router's softmax always
    /// renormalised to sum 1 (transformers' `MixtralSparseMoeBlock` has no switch for it).
    pub(super) fn mixtral(&self) -> Result<MoeConfig> {
        let fail = |m: String| Err(EngineError::Config(m));
        self.check_router_scoring("mixtral")?;
        let Some(num_experts) = self.num_local_experts else {
            return fail("mixtral: num_local_experts is missing".into());
        };
        let Some(top_k) = self.num_experts_per_tok else {
            return fail("mixtral: num_experts_per_tok is missing".into());
        };
        Ok(MoeConfig {
            num_experts,
            top_k,
            intermediate_size: self.intermediate_size,
            norm_topk_prob: true,
            layers: vec![true; self.num_hidden_layers],
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::model::ModelConfig;
    use crate::spec::moe::ExpertTensor;

    fn mixtral(change: serde_json::Value) -> Result<ModelConfig> {
        crate::families::hf_config::read(
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
        assert_eq!(c.architecture, "mixtral");
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
