//! gpt-oss (`GptOssForCausalLM`) from a Hugging Face `config.json`: the llama layer with
//! attention sinks, biases on every attention projection, sliding-window layers listed in
//! `layer_types`, and a mixture of experts whose router and experts carry biases and
//! whose gate is clamped. Defaults are transformers' `GptOssConfig`'s.

use crate::error::{EngineError, Result};
use crate::families::hf_config::HfConfig;
use crate::spec::model::{ModelConfig, SlidingWindow};
use crate::spec::moe::{ClampedSwiglu, ExpertNames, MoeConfig, MoeFields};

/// transformers' defaults for gpt-oss.
const DEFAULT_WINDOW: usize = 128;
const DEFAULT_SWIGLU_ALPHA: f32 = 1.702;
const DEFAULT_SWIGLU_LIMIT: f32 = 7.0;

impl HfConfig {
    /// gpt-oss's experts: `num_local_experts` of `intermediate_size` in every layer, the
    /// top `num_experts_per_tok` router logits softmaxed among themselves (the same as
    /// the full softmax renormalised over the chosen ones).
    pub(super) fn gpt_oss_experts(&self) -> Result<MoeConfig> {
        let fail = |m: &str| Err(EngineError::Config(format!("gpt_oss: {m}")));
        self.check_router_scoring("gpt_oss")?;
        let Some(num_experts) = self.num_local_experts else {
            return fail("num_local_experts is missing");
        };
        let Some(top_k) = self.num_experts_per_tok else {
            return fail("num_experts_per_tok is missing");
        };
        let alpha = self.swiglu_alpha.unwrap_or(DEFAULT_SWIGLU_ALPHA);
        let limit = self.swiglu_limit.unwrap_or(DEFAULT_SWIGLU_LIMIT);
        for (name, v) in [("swiglu_alpha", alpha), ("swiglu_limit", limit)] {
            if !(v.is_finite() && v > 0.0) {
                return fail(&format!("{name} {v} must be positive"));
            }
        }
        Ok(MoeConfig {
            num_experts,
            top_k,
            intermediate_size: self.intermediate_size,
            norm_topk_prob: true,
            layers: vec![true; self.num_hidden_layers],
            names: ExpertNames::GptOss,
            fields: MoeFields::new(
                "num_local_experts",
                "num_experts_per_tok",
                "intermediate_size",
            ),
            biases: true,
            clamped_swiglu: Some(ClampedSwiglu { alpha, limit }),
            sigmoid_router: None,
            shared_intermediate_size: None,
        })
    }

    /// The attention of gpt-oss: sinks in every layer, the output projection's bias with
    /// the others', and the layers `layer_types` marks (by default every other one, the
    /// first included) attending to their last `sliding_window` positions with the same
    /// RoPE as the rest.
    pub(super) fn set_gpt_oss_attention(&self, config: &mut ModelConfig) -> Result<()> {
        config.attention_sinks = true;
        config.attention_out_bias = config.attention_bias;
        let layers = match self.sliding_layer_types()? {
            Some(layers) => layers,
            None => (0..self.num_hidden_layers).map(|i| i % 2 == 0).collect(),
        };
        config.sliding_window = Some(SlidingWindow {
            window: self.sliding_window.unwrap_or(DEFAULT_WINDOW),
            layers,
            rope_theta: config.rope_theta,
            rope_scaling: config.rope_scaling.clone(),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::model::RopeStyle;
    use crate::spec::rope::RopeScaling;

    /// gpt-oss-20b's config.json as the checkpoint ships it, shrunk, with `change`.
    fn read(change: serde_json::Value) -> Result<ModelConfig> {
        let json = serde_json::json!({
            "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "attention_bias": true, "experts_per_token": 4, "head_dim": 64,
            "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
            "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention",
            "sliding_attention", "full_attention"], "max_position_embeddings": 131072,
            "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 4,
            "num_key_value_heads": 8, "num_local_experts": 32,
            "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                "quant_method": "mxfp4"},
            "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0,
                "factor": 32.0, "original_max_position_embeddings": 4096,
                "rope_type": "yarn", "truncate": false},
            "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
            "tie_word_embeddings": false, "vocab_size": 201088,
        });
        crate::families::hf_config::read(json, change)
    }

    #[test]
    fn gpt_oss_20b_config_is_read_as_transformers_reads_it() -> Result<()> {
        let c = read(serde_json::json!({}))?;
        assert_eq!(c.architecture, "gpt_oss");
        assert!(c.attention_sinks && c.attention_bias && c.attention_out_bias);
        assert!(!c.tie_word_embeddings && !c.qk_norm);
        assert_eq!((c.head_dim, c.rotary_dim), (64, 64));
        assert_eq!(c.rope_style, RopeStyle::Half);
        assert_eq!(c.rope_theta, 150000.0);
        match &c.rope_scaling {
            RopeScaling::Yarn(y) => {
                assert_eq!((y.factor, y.original_context), (32.0, 4096.0));
                assert!(!y.truncate);
            }
            other => panic!("{other:?}"),
        }
        let sw = c.sliding_window.clone().expect("window");
        assert_eq!(sw.window, 128);
        assert_eq!(sw.layers, vec![true, false, true, false]);
        assert_eq!(sw.rope_scaling, c.rope_scaling);
        let moe = c.moe.expect("experts");
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.intermediate_size),
            (32, 4, 2880)
        );
        assert!(moe.norm_topk_prob && moe.biases);
        assert_eq!(moe.layers, vec![true; 4]);
        assert_eq!(
            moe.clamped_swiglu,
            Some(ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0
            })
        );
        assert_eq!(
            moe.names.tensor(2, crate::spec::moe::ExpertTensor::Router),
            "model.layers.2.mlp.router.weight"
        );
        assert_eq!(
            moe.names.bias(2, crate::spec::moe::ExpertTensor::Down(5)),
            "model.layers.2.mlp.experts.5.down_proj.bias"
        );
        // Without layer_types every other layer slides, the first included.
        let c = read(serde_json::json!({"layer_types": null, "sliding_window": null}))?;
        let sw = c.sliding_window.expect("window");
        assert_eq!(
            (sw.window, sw.layers),
            (128, vec![true, false, true, false])
        );
        Ok(())
    }

    #[test]
    fn bad_gpt_oss_configs_are_refused_by_field() {
        for (change, field) in [
            (
                serde_json::json!({"num_local_experts": null}),
                "num_local_experts",
            ),
            (
                serde_json::json!({"num_experts_per_tok": 33}),
                "num_experts_per_tok",
            ),
            (serde_json::json!({"swiglu_limit": -1.0}), "swiglu_limit"),
            (
                serde_json::json!({"layer_types": ["sliding_attention", "chunked_attention",
                "full_attention", "full_attention"]}),
                "layer_types",
            ),
            (
                serde_json::json!({"layer_types": ["full_attention"]}),
                "sliding window",
            ),
        ] {
            match read(change.clone()) {
                Err(EngineError::Config(m)) => assert!(m.contains(field), "{change}: {m}"),
                other => panic!("{change}: {other:?}"),
            }
        }
    }
}
