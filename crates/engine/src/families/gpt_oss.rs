//! gpt-oss (`GptOssForCausalLM`; GGUF `gpt-oss`): llama's layer with attention sinks,
//! biases on every attention projection, a window in every other layer (or those
//! `layer_types` marks), and a mixture of experts whose router and experts carry biases
//! and whose gate is clamped. Its checkpoints' MXFP4 experts are read as stored. Defaults
//! are transformers' `GptOssConfig`'s, and llama.cpp's for its files.

use crate::error::{EngineError, Result};
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::families::row::{GgufExperts, GgufRouter, HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle, SlidingWindow};
use crate::spec::moe::{ClampedSwiglu, ExpertNames, MoeConfig, MoeFields};
use crate::spec::rope::RopeScaling;

static GPT_OSS: Family = Family {
    name: "gpt_oss",
    hf_names: &["gpt_oss", "GptOssForCausalLM"],
    gguf_names: &["gpt-oss"],
    tensors: TensorNames {
        // The MLP's input norm, as llama.cpp's converter names it.
        gguf_renames: &[(
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        )],
        ..TensorNames::LLAMA
    },
    quantizations: &["mxfp4"],
};

pub(super) static ROW: Row = Row {
    family: &GPT_OSS,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults {
        attention_bias: true,
        ..HfDefaults::LLAMA
    },
    gguf_experts: Some(GgufExperts {
        names: ExpertNames::GptOss,
        router: GgufRouter::SoftmaxOfChosen,
        shared_expert: false,
        // llama.cpp fixes the gate's clamp, as its files state none.
        clamped_with_biases: Some(GPT_OSS_SWIGLU),
        in_dense_files: false,
    }),
    from_hf,
    from_gguf,
    fixture: "tiny-gpt-oss",
};

/// gpt-oss's clamped gate, which llama.cpp fixes for gpt-oss files.
const GPT_OSS_SWIGLU: ClampedSwiglu = ClampedSwiglu {
    alpha: 1.702,
    limit: 7.0,
};

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    config.moe = Some(experts(hf)?);
    attention(hf, config)
}

/// gpt-oss as llama.cpp's converter writes it: biases on every attention projection
/// (where the file has them), a sink logit per query head, and a window of
/// `attention.sliding_window` in every other layer, the first included. YaRN rotates as
/// OpenAI's models were trained, without rounding the ramp's ends (llama.cpp rounds them).
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    config.attention_bias = gguf.has_tensor("blk.0.attn_q.bias");
    config.attention_out_bias = gguf.has_tensor("blk.0.attn_output.bias");
    config.attention_sinks = true;
    if let RopeScaling::Yarn(y) = &mut config.rope_scaling {
        y.truncate = false;
    }
    config.sliding_window = Some(SlidingWindow {
        window: gguf.usize("attention.sliding_window")?,
        layers: every_other_layer(config.num_layers),
        rope_theta: config.rope_theta,
        rope_scaling: config.rope_scaling.clone(),
    });
    Ok(())
}

/// Which of `layers` layers slide when every other one does, the first included.
fn every_other_layer(layers: usize) -> Vec<bool> {
    (0..layers).map(|i| i % 2 == 0).collect()
}

/// transformers' defaults for gpt-oss.
const DEFAULT_WINDOW: usize = 128;
const DEFAULT_SWIGLU_ALPHA: f32 = 1.702;
const DEFAULT_SWIGLU_LIMIT: f32 = 7.0;

/// gpt-oss's experts: `num_local_experts` of `intermediate_size` in every layer, the
/// top `num_experts_per_tok` router logits softmaxed among themselves (the same as
/// the full softmax renormalised over the chosen ones).
fn experts(hf: &HfConfig) -> Result<MoeConfig> {
    let fail = |m: &str| Err(EngineError::Config(format!("gpt_oss: {m}")));
    hf.check_router_scoring("gpt_oss")?;
    let Some(num_experts) = hf.num_local_experts else {
        return fail("num_local_experts is missing");
    };
    let Some(top_k) = hf.num_experts_per_tok else {
        return fail("num_experts_per_tok is missing");
    };
    let alpha = hf.swiglu_alpha.unwrap_or(DEFAULT_SWIGLU_ALPHA);
    let limit = hf.swiglu_limit.unwrap_or(DEFAULT_SWIGLU_LIMIT);
    for (name, v) in [("swiglu_alpha", alpha), ("swiglu_limit", limit)] {
        if !(v.is_finite() && v > 0.0) {
            return fail(&format!("{name} {v} must be positive"));
        }
    }
    Ok(MoeConfig {
        num_experts,
        top_k,
        intermediate_size: hf.intermediate_size,
        norm_topk_prob: true,
        layers: vec![true; hf.num_hidden_layers],
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
fn attention(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    config.attention_sinks = true;
    config.attention_out_bias = config.attention_bias;
    let layers = match hf.sliding_layer_types()? {
        Some(layers) => layers,
        None => every_other_layer(hf.num_hidden_layers),
    };
    config.sliding_window = Some(SlidingWindow {
        window: hf.sliding_window.unwrap_or(DEFAULT_WINDOW),
        layers,
        rope_theta: config.rope_theta,
        rope_scaling: config.rope_scaling.clone(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::gguf::{config_from_content, test_file};
    use crate::spec::model::RopeStyle;
    use crate::spec::rope::RopeFactorTensors;
    use crate::spec::rope::RopeScaling;
    use candle_core::quantized::gguf_file::Value;

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
        crate::families::hf::read(json, change)
    }

    #[test]
    fn gpt_oss_20b_config_is_read_as_transformers_reads_it() -> Result<()> {
        let c = read(serde_json::json!({}))?;
        assert_eq!(c.family.name, "gpt_oss");
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

    /// A gpt-oss file as llama.cpp's converter writes gpt-oss-20b: a window in every other
    /// layer, sinks, biases where its tensors are, YaRN without rounding, and experts with
    /// biases and the clamp llama.cpp fixes.
    #[test]
    fn gpt_oss_files_read_as_the_model_is_defined() -> Result<()> {
        let mut file = test_file("gpt-oss", 4);
        for (k, v) in [
            ("gpt-oss.attention.sliding_window", Value::U32(128)),
            ("gpt-oss.attention.key_length", Value::U32(64)),
            ("gpt-oss.expert_count", Value::U32(32)),
            ("gpt-oss.expert_used_count", Value::U32(4)),
            ("gpt-oss.expert_feed_forward_length", Value::U32(2880)),
            ("gpt-oss.rope.scaling.type", Value::String("yarn".into())),
            ("gpt-oss.rope.scaling.factor", Value::F32(32.0)),
            (
                "gpt-oss.rope.scaling.original_context_length",
                Value::U32(4096),
            ),
            ("gpt-oss.context_length", Value::U32(131072)),
        ] {
            file.metadata.insert(k.into(), v);
        }
        let info = || candle_core::quantized::gguf_file::TensorInfo {
            ggml_dtype: candle_core::quantized::GgmlDType::F32,
            shape: candle_core::Shape::from(vec![32]),
            offset: 0,
        };
        for l in 0..4 {
            file.tensor_infos
                .insert(format!("blk.{l}.ffn_gate_inp.weight"), info());
        }
        file.tensor_infos.insert("blk.0.attn_q.bias".into(), info());
        let c = config_from_content(&file, RopeFactorTensors::default())?;
        assert!(c.attention_sinks && c.attention_bias && !c.attention_out_bias);
        assert_eq!(c.rope_style, RopeStyle::Half);
        let sw = c.sliding_window.expect("window");
        assert_eq!(
            (sw.window, sw.layers),
            (128, vec![true, false, true, false])
        );
        match &c.rope_scaling {
            RopeScaling::Yarn(y) => assert!(!y.truncate && y.factor == 32.0),
            other => panic!("{other:?}"),
        }
        let moe = c.moe.expect("experts");
        assert_eq!((moe.num_experts, moe.top_k), (32, 4));
        assert!(moe.biases && moe.norm_topk_prob);
        assert_eq!(moe.clamped_swiglu, Some(GPT_OSS_SWIGLU));
        // llama.cpp's gating value for a softmax over the chosen logits is accepted.
        file.metadata
            .insert("gpt-oss.expert_gating_func".into(), Value::U32(3));
        assert!(config_from_content(&file, RopeFactorTensors::default()).is_ok());
        Ok(())
    }
}
