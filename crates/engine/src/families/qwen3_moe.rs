//! Qwen3-MoE (`Qwen3MoeForCausalLM`; GGUF `qwen3moe`): Qwen3's layer with a mixture of
//! experts in every `decoder_sparse_step`-th layer not listed in `mlp_only_layers` (in
//! GGUF files, the layers with a router).

use crate::error::{EngineError, Result};
use crate::families::hf_config::HfConfig;
use crate::families::row::{
    nothing_more_gguf, GgufExperts, GgufRouter, HfDefaults, Layer, QkNorm, Row,
};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};
use crate::spec::moe::{ExpertNames, MoeConfig, MoeFields};

static QWEN3_MOE: Family = Family {
    name: "qwen3_moe",
    hf_names: &["qwen3_moe", "Qwen3MoeForCausalLM"],
    gguf_names: &["qwen3moe"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &QWEN3_MOE,
    layer: Layer {
        qk_norm: QkNorm::PerHead,
        ..Layer::LLAMA
    },
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: Some(GgufExperts {
        names: ExpertNames::Qwen3Moe,
        router: GgufRouter::Softmax,
        shared_expert: false,
        clamped_with_biases: None,
        in_dense_files: false,
    }),
    from_hf,
    from_gguf: nothing_more_gguf,
    fixture: "tiny-qwen3-moe",
};

fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    config.moe = Some(experts(hf)?);
    Ok(())
}

/// Qwen3-MoE's experts and which layers hold them: every `decoder_sparse_step`-th
/// layer not listed in `mlp_only_layers`. Each bad field is refused by name.
fn experts(hf: &HfConfig) -> Result<MoeConfig> {
    let fail = |m: String| Err(EngineError::Config(m));
    hf.check_router_scoring("qwen3_moe")?;
    let Some(num_experts) = hf.num_local_experts.or(hf.num_experts) else {
        return fail("qwen3_moe: num_experts (num_local_experts) is missing".into());
    };
    let Some(top_k) = hf.num_experts_per_tok else {
        return fail("qwen3_moe: num_experts_per_tok is missing".into());
    };
    let Some(intermediate_size) = hf.moe_intermediate_size else {
        return fail("qwen3_moe: moe_intermediate_size is missing".into());
    };
    let step = hf.decoder_sparse_step.unwrap_or(1);
    if step == 0 {
        return fail("decoder_sparse_step must be at least 1".into());
    }
    let dense = hf.mlp_only_layers.clone().unwrap_or_default();
    if let Some(bad) = dense.iter().find(|l| **l >= hf.num_hidden_layers) {
        return fail(format!(
            "mlp_only_layers names layer {bad} of a {}-layer model",
            hf.num_hidden_layers
        ));
    }
    let layers = (0..hf.num_hidden_layers)
        .map(|l| num_experts > 0 && !dense.contains(&l) && (l + 1) % step == 0)
        .collect();
    let experts_field = if hf.num_local_experts.is_some() {
        "num_local_experts"
    } else {
        "num_experts"
    };
    Ok(MoeConfig {
        num_experts,
        top_k,
        intermediate_size,
        norm_topk_prob: hf.norm_topk_prob.unwrap_or(false),
        layers,
        names: ExpertNames::Qwen3Moe,
        biases: false,
        clamped_swiglu: None,
        sigmoid_router: None,
        shared_intermediate_size: None,
        fields: MoeFields::new(
            experts_field,
            "num_experts_per_tok",
            "moe_intermediate_size",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3_moe(change: serde_json::Value) -> Result<ModelConfig> {
        crate::families::hf::read(
            serde_json::json!({
                "model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 64,
                "intermediate_size": 96, "moe_intermediate_size": 40, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "num_local_experts": 6, "num_experts_per_tok": 2, "norm_topk_prob": true,
                "decoder_sparse_step": 1, "mlp_only_layers": [1],
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
    fn qwen3_moe_layers_follow_the_sparse_step_and_dense_list() -> Result<()> {
        let c = qwen3_moe(serde_json::json!({}))?;
        let moe = c.moe.clone().expect("moe");
        assert_eq!(
            (moe.num_experts, moe.top_k, moe.intermediate_size),
            (6, 2, 40)
        );
        assert_eq!(moe.layers, vec![true, false, true]);
        assert_eq!(moe.names, ExpertNames::Qwen3Moe);
        assert!(c.qk_norm && moe.norm_topk_prob);
        // The older name of the expert count, and every second layer sparse.
        let c = qwen3_moe(serde_json::json!({
            "num_local_experts": null, "num_experts": 8, "decoder_sparse_step": 2,
            "mlp_only_layers": []
        }))?;
        let moe = c.moe.expect("moe");
        assert_eq!(moe.num_experts, 8);
        assert_eq!(moe.layers, vec![false, true, false]);
        Ok(())
    }

    #[test]
    fn bad_mixture_configs_are_refused_by_field() {
        for (change, field) in [
            (
                serde_json::json!({"num_experts_per_tok": 7}),
                "num_experts_per_tok",
            ),
            (
                serde_json::json!({"num_experts_per_tok": 0}),
                "num_experts_per_tok",
            ),
            (
                serde_json::json!({"num_local_experts": 0}),
                "num_local_experts",
            ),
            (
                serde_json::json!({"num_local_experts": null, "num_experts": 0}),
                "num_experts",
            ),
            (
                serde_json::json!({"moe_intermediate_size": 0}),
                "moe_intermediate_size",
            ),
            (
                serde_json::json!({"moe_intermediate_size": null}),
                "moe_intermediate_size",
            ),
            (
                serde_json::json!({"decoder_sparse_step": 0}),
                "decoder_sparse_step",
            ),
            (
                serde_json::json!({"mlp_only_layers": [3]}),
                "mlp_only_layers",
            ),
            (
                serde_json::json!({"scoring_func": "sigmoid"}),
                "scoring_func",
            ),
            (
                serde_json::json!({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}),
                "rope_scaling",
            ),
        ] {
            refused_by_field(qwen3_moe(change.clone()), field, &change);
        }
    }
}
