//! Canonical (Hugging Face) tensor names to where llama.cpp's converter puts the tensor in a
//! GGUF file: a tensor of its own (`blk.3.attn_q.weight`), or one expert's slice of a 3-D
//! expert tensor (`blk.3.ffn_gate_exps.weight`, `[experts, rows, cols]`).

use crate::error::{EngineError, Result};
use crate::spec::family::TensorNames;

/// Where a canonical tensor lives in a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GgufLocation {
    /// The GGUF tensor's name.
    pub name: String,
    /// For an expert's weight: its index along the first dimension of the 3-D tensor.
    pub expert: Option<usize>,
}

/// Maps a canonical (Hugging Face) tensor name to its GGUF name (tensors stored on their
/// own; experts' weights are slices, see [`locate`]).
pub fn gguf_name(canonical: &str) -> Option<String> {
    let fixed = match canonical {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.to_string());
    }
    let rest = canonical.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let mapped = match suffix {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.o_proj.bias" => "attn_output.bias",
        // gpt-oss's sink logits.
        "self_attn.sinks" => "attn_sinks.weight",
        // Phi-3's fused query/key/value rows.
        "self_attn.qkv_proj.weight" => "attn_qkv.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        // The router of a mixture (Qwen3-MoE, Mixtral).
        "mlp.gate.weight" | "block_sparse_moe.gate.weight" | "mlp.router.weight" => {
            "ffn_gate_inp.weight"
        }
        "mlp.router.bias" => "ffn_gate_inp.bias",
        // GLM-4.5's and MiniMax-M2's router correction biases; GLM-4.5's shared expert.
        "mlp.gate.e_score_correction_bias" | "block_sparse_moe.e_score_correction_bias" => {
            "exp_probs_b.bias"
        }
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        // GLM-4.5's multi-token-prediction layer, after the decoder layers.
        "eh_proj.weight" => "nextn.eh_proj.weight",
        "enorm.weight" => "nextn.enorm.weight",
        "hnorm.weight" => "nextn.hnorm.weight",
        "shared_head.norm.weight" => "nextn.shared_head_norm.weight",
        "shared_head.head.weight" => "nextn.shared_head_head.weight",
        "embed_tokens.weight" => "nextn.embed_tokens.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{mapped}"))
}

/// The 3-D tensor and index of an expert's weight: `model.layers.L.mlp.experts.E.gate_proj`
/// (Qwen3-MoE) or `model.layers.L.block_sparse_moe.experts.E.w1` (Mixtral) is expert E of
/// `blk.L.ffn_gate_exps`; up (`w3`) and down (`w2`) likewise.
fn expert_location(canonical: &str) -> Option<GgufLocation> {
    let rest = canonical.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let experts = suffix
        .strip_prefix("mlp.experts.")
        .or_else(|| suffix.strip_prefix("block_sparse_moe.experts."))?;
    let (expert, projection) = experts.split_once('.')?;
    let (projection, part) = projection.rsplit_once('.')?;
    let kind = match projection {
        "gate_proj" | "w1" => "gate",
        "up_proj" | "w3" => "up",
        "down_proj" | "w2" => "down",
        _ => return None,
    };
    // gpt-oss's expert biases are rows of a 2-D `ffn_*_exps.bias`.
    if !matches!(part, "weight" | "bias") {
        return None;
    }
    Some(GgufLocation {
        name: format!("blk.{layer}.ffn_{kind}_exps.{part}"),
        expert: Some(expert.parse().ok()?),
    })
}

/// Where `canonical` lives in a GGUF file of a family whose files name tensors as
/// `tensors` says: its renamed layer tensors (a sandwich layer's norms, which llama's
/// names would misplace), and a fused gate/up `ffn_up` that answers for
/// `mlp.gate_up_proj` alone; every other tensor where llama's files have it.
pub(crate) fn locate(tensors: &TensorNames, canonical: &str) -> Result<GgufLocation> {
    if let Some(location) = expert_location(canonical) {
        return Ok(location);
    }
    let layer_suffix = canonical
        .strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'));
    if tensors.gguf_fused_gate_up {
        if let Some((layer, "mlp.gate_up_proj.weight")) = layer_suffix {
            return Ok(GgufLocation {
                name: format!("blk.{layer}.ffn_up.weight"),
                expert: None,
            });
        }
        if canonical.ends_with(".mlp.up_proj.weight") {
            return Err(EngineError::MissingTensor(canonical.to_string()));
        }
    }
    let renamed = layer_suffix.and_then(|(layer, suffix)| {
        let (_, gguf) = tensors.gguf_renames.iter().find(|(c, _)| *c == suffix)?;
        Some(format!("blk.{layer}.{gguf}"))
    });
    renamed
        .or_else(|| gguf_name(canonical))
        .map(|name| GgufLocation { name, expert: None })
        .ok_or_else(|| EngineError::MissingTensor(canonical.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_names_map_to_gguf() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.o_proj.weight").as_deref(),
            Some("blk.12.attn_output.weight")
        );
        assert_eq!(
            gguf_name("lm_head.weight").as_deref(),
            Some("output.weight")
        );
        assert_eq!(gguf_name("model.layers.x"), None);
    }

    #[test]
    fn experts_of_both_families_are_slices_of_the_same_3d_tensors() -> Result<()> {
        let at = |name: &str, expert| GgufLocation {
            name: name.into(),
            expert,
        };
        for (canonical, want) in [
            (
                "model.layers.2.mlp.experts.5.gate_proj.weight",
                at("blk.2.ffn_gate_exps.weight", Some(5)),
            ),
            (
                "model.layers.0.mlp.experts.0.down_proj.weight",
                at("blk.0.ffn_down_exps.weight", Some(0)),
            ),
            (
                "model.layers.1.block_sparse_moe.experts.7.w1.weight",
                at("blk.1.ffn_gate_exps.weight", Some(7)),
            ),
            (
                "model.layers.1.block_sparse_moe.experts.7.w3.weight",
                at("blk.1.ffn_up_exps.weight", Some(7)),
            ),
            (
                "model.layers.1.block_sparse_moe.experts.7.w2.weight",
                at("blk.1.ffn_down_exps.weight", Some(7)),
            ),
            (
                "model.layers.4.block_sparse_moe.gate.weight",
                at("blk.4.ffn_gate_inp.weight", None),
            ),
            (
                "model.layers.4.mlp.gate.weight",
                at("blk.4.ffn_gate_inp.weight", None),
            ),
            // gpt-oss's biases: of an expert, a row of a 2-D tensor.
            (
                "model.layers.3.mlp.experts.2.up_proj.bias",
                at("blk.3.ffn_up_exps.bias", Some(2)),
            ),
            (
                "model.layers.3.mlp.router.bias",
                at("blk.3.ffn_gate_inp.bias", None),
            ),
            // The dense MLP of a Qwen3-MoE layer is not an expert.
            (
                "model.layers.1.mlp.gate_proj.weight",
                at("blk.1.ffn_gate.weight", None),
            ),
        ] {
            assert_eq!(locate(&TensorNames::LLAMA, canonical)?, want, "{canonical}");
        }
        assert!(locate(
            &TensorNames::LLAMA,
            "model.layers.1.mlp.experts.x.w1.weight"
        )
        .is_err());
        Ok(())
    }
}
