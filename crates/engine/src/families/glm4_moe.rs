//! GLM-4.5 (`Glm4MoeForCausalLM`: GLM-4.5, GLM-4.5-Air, GLM-4.6; GGUF `glm4moe`): llama's
//! layer with query/key/value biases, half of each head rotating (`partial_rotary_factor`,
//! in halves as llama rotates), optional per-head query/key norms (`use_qk_norm`; in GGUF
//! files, where they are stored), and after `first_k_dense_replace` dense layers a mixture
//! of `n_routed_experts` with a sigmoid router and a shared expert. Defaults are
//! transformers' `Glm4MoeConfig`'s.

use crate::error::{EngineError, Result};
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::families::row::{GgufExperts, GgufRouter, HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};
use crate::spec::moe::{ExpertNames, MoeConfig, MoeFields, SigmoidRouter};

static GLM4_MOE: Family = Family {
    name: "glm4_moe",
    hf_names: &["glm4_moe", "Glm4MoeForCausalLM"],
    gguf_names: &["glm4moe"],
    tensors: TensorNames {
        // The MLP's input norm, as llama.cpp's converter names it.
        gguf_renames: &[(
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        )],
        ..TensorNames::LLAMA
    },
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &GLM4_MOE,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: Some(GgufExperts {
        names: ExpertNames::Qwen3Moe,
        router: GgufRouter::Sigmoid,
        shared_expert: true,
        clamped_with_biases: None,
        in_dense_files: false,
    }),
    from_hf,
    from_gguf,
    fixture: "tiny-glm4-moe",
};

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    config.qk_norm = hf.use_qk_norm.unwrap_or(false);
    config.moe = Some(experts(hf)?);
    config.prediction_layers = hf
        .num_nextn_predict_layers
        .unwrap_or(DEFAULT_PREDICTION_LAYERS);
    Ok(())
}

/// Its files hold the biases and the query/key norms its checkpoint has
/// (`attention_bias`, `use_qk_norm`).
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    config.attention_bias = gguf.has_tensor("blk.0.attn_q.bias");
    config.qk_norm = gguf.has_tensor("blk.0.attn_q_norm.weight");
    Ok(())
}

/// transformers' defaults for GLM-4.5.
const DEFAULT_EXPERTS: usize = 128;
const DEFAULT_TOP_K: usize = 8;
const DEFAULT_SHARED: usize = 1;
const DEFAULT_DENSE_LAYERS: usize = 1;
const DEFAULT_SCALE: f32 = 1.0;
const DEFAULT_PREDICTION_LAYERS: usize = 1;

/// GLM-4.5's mixture: which layers hold it, its sigmoid router and its shared expert.
fn experts(hf: &HfConfig) -> Result<MoeConfig> {
    let fail = |m: String| Err(EngineError::Config(format!("glm4_moe: {m}")));
    match hf.scoring_func.as_deref() {
        None | Some("sigmoid") => {}
        Some(other) => return fail(format!("scoring_func '{other}' (its router is a sigmoid)")),
    }
    let (num_experts, experts_field) = match (hf.n_routed_experts, hf.num_local_experts) {
        (Some(n), _) => (n, "n_routed_experts"),
        (None, Some(n)) => (n, "num_local_experts"),
        (None, None) => (DEFAULT_EXPERTS, "n_routed_experts"),
    };
    let Some(intermediate_size) = hf.moe_intermediate_size else {
        return fail("moe_intermediate_size is missing".into());
    };
    let shared = hf.n_shared_experts.unwrap_or(DEFAULT_SHARED);
    let dense = hf.first_k_dense_replace.unwrap_or(DEFAULT_DENSE_LAYERS);
    if dense > hf.num_hidden_layers {
        return fail(format!(
            "first_k_dense_replace {dense} exceeds the {} layers",
            hf.num_hidden_layers
        ));
    }
    Ok(MoeConfig {
        num_experts,
        top_k: hf.num_experts_per_tok.unwrap_or(DEFAULT_TOP_K),
        intermediate_size,
        norm_topk_prob: hf.norm_topk_prob.unwrap_or(true),
        layers: (0..hf.num_hidden_layers).map(|l| l >= dense).collect(),
        names: ExpertNames::Qwen3Moe,
        fields: MoeFields::new(
            experts_field,
            "num_experts_per_tok",
            "moe_intermediate_size",
        ),
        biases: false,
        clamped_swiglu: None,
        sigmoid_router: Some(SigmoidRouter {
            groups: hf.n_group.unwrap_or(1),
            top_groups: hf.topk_group.unwrap_or(1),
            scale: hf.routed_scaling_factor.unwrap_or(DEFAULT_SCALE),
        }),
        shared_intermediate_size: (shared > 0).then(|| intermediate_size * shared),
    })
}

#[cfg(test)]
mod tests {
    use crate::error::{EngineError, Result};
    use crate::spec::model::ModelConfig;

    /// GLM-4.5-Air's config.json in miniature.
    fn glm4_moe(change: serde_json::Value) -> Result<ModelConfig> {
        crate::families::hf::read(
            serde_json::json!({
                "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
                "vocab_size": 512, "hidden_size": 128, "intermediate_size": 96,
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "partial_rotary_factor": 0.5, "attention_bias": true,
                "use_qk_norm": false, "moe_intermediate_size": 48, "n_routed_experts": 8,
                "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                "n_group": 2, "topk_group": 1, "norm_topk_prob": true,
                "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1,
                "rope_theta": 10000.0, "max_position_embeddings": 512,
            }),
            change,
        )
    }

    #[test]
    fn glm4_moe_reads_its_router_shared_expert_and_dense_layers() -> Result<()> {
        let c = glm4_moe(serde_json::json!({}))?;
        assert_eq!(c.family.name, "glm4_moe");
        assert_eq!((c.head_dim, c.rotary_dim), (32, 16));
        assert_eq!(c.rope_style, crate::spec::model::RopeStyle::Half);
        assert!(c.attention_bias && !c.attention_out_bias && !c.qk_norm);
        let m = c.moe.as_ref().expect("a mixture");
        assert_eq!((m.num_experts, m.top_k, m.intermediate_size), (8, 2, 48));
        assert_eq!(m.layers, vec![false, true, true]);
        assert_eq!(m.shared_intermediate_size, Some(48));
        let r = m.sigmoid_router.expect("a sigmoid router");
        assert_eq!((r.groups, r.top_groups, r.scale), (2, 1, 2.5));
        assert!(m.norm_topk_prob);
        assert!(glm4_moe(serde_json::json!({"use_qk_norm": true}))?.qk_norm);
        let none = glm4_moe(serde_json::json!({"n_shared_experts": 0}))?;
        assert_eq!(none.moe.and_then(|m| m.shared_intermediate_size), None);
        Ok(())
    }

    #[test]
    fn bad_glm4_moe_configs_are_refused_by_field() {
        for (change, field) in [
            (serde_json::json!({"n_group": 3}), "n_group"),
            (serde_json::json!({"topk_group": 3}), "topk_group"),
            (
                serde_json::json!({"num_experts_per_tok": 5}),
                "num_experts_per_tok",
            ),
            (
                serde_json::json!({"routed_scaling_factor": 0.0}),
                "routed_scaling_factor",
            ),
            (
                serde_json::json!({"first_k_dense_replace": 4}),
                "first_k_dense_replace",
            ),
            (
                serde_json::json!({"scoring_func": "softmax"}),
                "scoring_func",
            ),
            (
                serde_json::json!({"moe_intermediate_size": null}),
                "moe_intermediate_size",
            ),
        ] {
            match glm4_moe(change.clone()) {
                Err(EngineError::Config(m)) => assert!(m.contains(field), "{change}: {m}"),
                other => panic!("{change}: {other:?}"),
            }
        }
    }
}
