//! MiniMax-M2 (`MiniMaxM2ForCausalLM`: MiniMax-M2, M2.1 and M2.5; GGUF `minimax-m2`):
//! llama's layer with query and key RMSNorms over all of a token's heads (as OLMo 2's,
//! `qk_norm_type` "per_layer"), the first `rotary_dim` dimensions of each head rotating
//! (in halves, as llama rotates), and in every layer a mixture of `num_local_experts` of
//! `intermediate_size` under Mixtral's tensor names, routed by a sigmoid: the choice reads
//! each score plus `e_score_correction_bias`, the chosen experts weigh by their scores
//! renormalised to sum 1. Defaults are transformers' `MiniMaxM2Config`'s.

use crate::error::{EngineError, Result};
use crate::families::hf_config::HfConfig;
use crate::families::row::{
    nothing_more_gguf, GgufExperts, GgufRouter, HfDefaults, Layer, QkNorm, Row,
};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};
use crate::spec::moe::{ExpertNames, MoeConfig, MoeFields, SigmoidRouter};
use crate::spec::rope;

static MINIMAX_M2: Family = Family {
    name: "minimax_m2",
    hf_names: &["minimax_m2", "MiniMaxM2ForCausalLM"],
    gguf_names: &["minimax-m2"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &MINIMAX_M2,
    layer: Layer {
        qk_norm: QkNorm::AcrossHeads,
        ..Layer::LLAMA
    },
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults {
        rope_theta: 5_000_000.0,
        ..HfDefaults::LLAMA
    },
    gguf_experts: Some(GgufExperts {
        names: ExpertNames::MiniMaxM2,
        // Files of its first converter state no gating function.
        router: GgufRouter::Sigmoid,
        shared_expert: false,
        clamped_with_biases: None,
        in_dense_files: false,
    }),
    from_hf,
    from_gguf: nothing_more_gguf,
    fixture: "tiny-minimax-m2",
};

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    check(hf)?;
    config.rotary_dim = rope::rotary_dim(config.head_dim, rotated_share(hf, config.head_dim)?)?;
    config.moe = Some(experts(hf)?);
    config.prediction_layers = hf.num_mtp_modules.unwrap_or(0);
    Ok(())
}

const DEFAULT_EXPERTS: usize = 256;
const DEFAULT_TOP_K: usize = 8;

/// The share of each head that rotates: transformers 5's `rope_parameters`, else the
/// checkpoint's `rotary_dim` over `head_dim`, else half (transformers' default).
fn rotated_share(hf: &HfConfig, head_dim: usize) -> Result<f64> {
    if let Some(share) = hf.rotary_share()? {
        return Ok(share);
    }
    let rotary_dim = hf.rotary_dim.unwrap_or(head_dim / 2);
    if rotary_dim == 0 || rotary_dim > head_dim || !rotary_dim.is_multiple_of(2) {
        return Err(EngineError::Config(format!(
            "minimax_m2: rotary_dim {rotary_dim} must be even and in 2..={head_dim} \
             (head_dim)"
        )));
    }
    Ok(rotary_dim as f64 / head_dim as f64)
}

/// Refuses what the checkpoint's own code can switch and this layer cannot: query and
/// key norms other than over all heads, attention other than softmax attention in a
/// layer (`attn_type_list` 0: MiniMax-01's lightning attention), a shared expert, and
/// a router other than the biased sigmoid.
fn check(hf: &HfConfig) -> Result<()> {
    let fail = |m: String| Err(EngineError::Config(format!("minimax_m2: {m}")));
    if hf.use_qk_norm == Some(false) {
        return fail("use_qk_norm false (its layers norm queries and keys)".into());
    }
    match hf.qk_norm_type.as_deref() {
        None | Some("per_layer") => {}
        Some(other) => {
            return fail(format!(
                "qk_norm_type '{other}' (only \"per_layer\", over all heads)"
            ))
        }
    }
    if let Some(types) = &hf.attn_type_list {
        if types.len() != hf.num_hidden_layers {
            return fail(format!(
                "attn_type_list lists {} layers of a {}-layer model",
                types.len(),
                hf.num_hidden_layers
            ));
        }
        if let Some(layer) = types.iter().position(|t| *t != 1) {
            return fail(format!(
                "attn_type_list: layer {layer} is not softmax attention (type 1)"
            ));
        }
    }
    if hf.shared_intermediate_size.is_some_and(|s| s > 0) {
        return fail("shared_intermediate_size > 0 (a shared expert)".into());
    }
    match hf.scoring_func.as_deref() {
        None | Some("sigmoid") => {}
        Some(other) => return fail(format!("scoring_func '{other}' (its router is a sigmoid)")),
    }
    if hf.use_routing_bias == Some(false) {
        return fail("use_routing_bias false (its router adds e_score_correction_bias)".into());
    }
    Ok(())
}

/// MiniMax-M2's mixture: every layer, one group, no scale.
fn experts(hf: &HfConfig) -> Result<MoeConfig> {
    Ok(MoeConfig {
        num_experts: hf.num_local_experts.unwrap_or(DEFAULT_EXPERTS),
        top_k: hf.num_experts_per_tok.unwrap_or(DEFAULT_TOP_K),
        intermediate_size: hf.intermediate_size,
        norm_topk_prob: true,
        layers: vec![true; hf.num_hidden_layers],
        names: ExpertNames::MiniMaxM2,
        fields: MoeFields::new(
            "num_local_experts",
            "num_experts_per_tok",
            "intermediate_size",
        ),
        biases: false,
        clamped_swiglu: None,
        sigmoid_router: Some(SigmoidRouter {
            groups: 1,
            top_groups: 1,
            scale: 1.0,
        }),
        shared_intermediate_size: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{EngineError, Result};
    use crate::spec::moe::ExpertTensor;

    /// MiniMax-M2's config.json in miniature, with the keys its checkpoints carry.
    fn minimax_m2(change: serde_json::Value) -> Result<ModelConfig> {
        crate::families::hf::read(
            serde_json::json!({
                "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
                "vocab_size": 512, "hidden_size": 128, "intermediate_size": 48,
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "rotary_dim": 16, "num_local_experts": 8,
                "num_experts_per_tok": 2, "scoring_func": "sigmoid", "use_routing_bias": true,
                "use_qk_norm": true, "qk_norm_type": "per_layer", "attn_type_list": [1, 1, 1],
                "shared_intermediate_size": 0, "max_position_embeddings": 512,
                "rms_norm_eps": 1e-6, "use_mtp": true, "num_mtp_modules": 3,
            }),
            change,
        )
    }

    #[test]
    fn minimax_m2_reads_its_norms_rotation_and_router() -> Result<()> {
        let c = minimax_m2(serde_json::json!({}))?;
        assert_eq!(c.family.name, "minimax_m2");
        assert_eq!((c.head_dim, c.rotary_dim), (32, 16));
        assert_eq!(c.rope_theta, 5_000_000.0);
        assert!(c.qk_norm && c.qk_norm_across_heads && c.input_norms && !c.sandwich_norms);
        assert!(!c.attention_bias && !c.tie_word_embeddings);
        let m = c.moe.as_ref().expect("a mixture");
        assert_eq!((m.num_experts, m.top_k, m.intermediate_size), (8, 2, 48));
        assert_eq!(m.layers, vec![true; 3]);
        assert!(m.norm_topk_prob && m.shared_intermediate_size.is_none());
        let r = m.sigmoid_router.expect("a sigmoid router");
        assert_eq!((r.groups, r.top_groups, r.scale), (1, 1, 1.0));
        assert_eq!(
            ExpertNames::MiniMaxM2.tensor(1, ExpertTensor::ScoreCorrection),
            "model.layers.1.block_sparse_moe.e_score_correction_bias"
        );
        assert_eq!(
            ExpertNames::MiniMaxM2.tensor(1, ExpertTensor::Up(3)),
            "model.layers.1.block_sparse_moe.experts.3.w3.weight"
        );
        // transformers 5 writes the share into rope_parameters; half by default.
        let v5 = minimax_m2(serde_json::json!({"rotary_dim": null, "rope_parameters":
            {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}))?;
        assert_eq!((v5.rotary_dim, v5.rope_theta), (8, 10000.0));
        assert_eq!(
            minimax_m2(serde_json::json!({"rotary_dim": null}))?.rotary_dim,
            16
        );
        Ok(())
    }

    #[test]
    fn bad_minimax_m2_configs_are_refused_by_field() {
        for (change, field) in [
            (serde_json::json!({"use_qk_norm": false}), "use_qk_norm"),
            (
                serde_json::json!({"qk_norm_type": "per_head"}),
                "qk_norm_type",
            ),
            (serde_json::json!({"attn_type_list": [1, 0, 1]}), "layer 1"),
            (
                serde_json::json!({"attn_type_list": [1, 1]}),
                "attn_type_list",
            ),
            (
                serde_json::json!({"shared_intermediate_size": 64}),
                "shared_intermediate_size",
            ),
            (
                serde_json::json!({"scoring_func": "softmax"}),
                "scoring_func",
            ),
            (
                serde_json::json!({"use_routing_bias": false}),
                "use_routing_bias",
            ),
            (serde_json::json!({"rotary_dim": 33}), "rotary_dim"),
            (
                serde_json::json!({"num_experts_per_tok": 9}),
                "num_experts_per_tok",
            ),
        ] {
            match minimax_m2(change.clone()) {
                Err(EngineError::Config(m)) => assert!(m.contains(field), "{change}: {m}"),
                other => panic!("{change}: {other:?}"),
            }
        }
    }
}
