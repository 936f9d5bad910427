//! A mixture of experts from GGUF metadata, as llama.cpp reads its families' files:
//! `<arch>.expert_count` experts, `<arch>.expert_used_count` per token, each of
//! `<arch>.expert_feed_forward_length` columns, in the layers that have a router
//! (`blk.N.ffn_gate_inp.weight`). The family's row says what else its files may hold
//! ([`GgufExperts`]); each refusal names the key it read and the families that read it.

use crate::error::{EngineError, Result};
use crate::families::gguf_metadata::Gguf;
use crate::families::row::{GgufExperts, GgufRouter};
use crate::families::table::gguf_names_of;
use crate::families::FAMILIES;
use crate::spec::moe::{MoeConfig, MoeFields, SigmoidRouter};

/// llama.cpp's `expert_gating_func` values that mean a softmax router (0: unset, which
/// llama.cpp reads as softmax; 1: softmax).
const GATING_SOFTMAX: [usize; 2] = [0, 1];
/// llama.cpp's `expert_gating_func` of a softmax over the chosen experts' logits.
const GATING_SOFTMAX_WEIGHT: usize = 3;
/// llama.cpp's `expert_gating_func` of a sigmoid router (llama.cpp's default for the
/// families that have one).
const GATING_SIGMOID: usize = 2;

/// A file of a family without experts has none.
pub(crate) fn refuse(gguf: &Gguf<'_>) -> Result<()> {
    match gguf.usize_opt("expert_count")?.filter(|n| *n > 0) {
        None => Ok(()),
        Some(n) => Err(EngineError::Config(format!(
            "{} {n}: mixtures of experts are read from {} files only",
            gguf.key("expert_count"),
            gguf_names_of(FAMILIES.iter().filter(|r| r.gguf_experts.is_some()))
        ))),
    }
}

impl GgufExperts {
    /// The mixture of `gguf` over its first `num_layers` layers; `None` for a dense file
    /// where the family's files may be dense. The chosen experts' weights are
    /// renormalised, as llama.cpp does, unless `<arch>.expert_weights_norm` says
    /// otherwise.
    pub(crate) fn read(&self, gguf: &Gguf<'_>, num_layers: usize) -> Result<Option<MoeConfig>> {
        let fail = |m: String| Err(EngineError::Config(m));
        let key = |k: &str| gguf.key(k);
        let count = gguf.usize_opt("expert_count")?;
        if self.in_dense_files && matches!(count, None | Some(0)) {
            return Ok(None);
        }
        let Some(num_experts) = count else {
            return fail(format!("{} is missing", key("expert_count")));
        };
        let top_k = gguf.usize("expert_used_count")?;
        let (intermediate_field, intermediate_size) =
            match gguf.usize_opt("expert_feed_forward_length")? {
                Some(n) => (key("expert_feed_forward_length"), n),
                None if self.in_dense_files => (
                    key("feed_forward_length"),
                    gguf.usize("feed_forward_length")?,
                ),
                None => return fail(format!("{} is missing", key("expert_feed_forward_length"))),
            };
        let shared = gguf.usize_opt("expert_shared_count")?.filter(|n| *n > 0);
        if let Some(shared) = shared.filter(|_| !self.shared_expert) {
            return fail(format!(
                "{} {shared}: shared experts are read from {} files only",
                key("expert_shared_count"),
                gguf_names_of(
                    FAMILIES
                        .iter()
                        .filter(|r| { r.gguf_experts.is_some_and(|e| e.shared_expert) })
                )
            ));
        }
        let sigmoid = self.sigmoid(gguf)?;
        let scale = gguf.f32_opt("expert_weights_scale")?;
        if let Some(scale) = scale.filter(|s| *s != 1.0 && !sigmoid) {
            return fail(format!(
                "{} {scale}: scaled expert weights are read from {} files only",
                key("expert_weights_scale"),
                gguf_names_of(FAMILIES.iter().filter(|r| {
                    r.gguf_experts
                        .is_some_and(|e| e.router == GgufRouter::Sigmoid)
                }))
            ));
        }
        let norm = gguf.bool_opt("expert_weights_norm")?.unwrap_or(true);
        let layers: Vec<bool> = (0..num_layers)
            .map(|l| gguf.has_tensor(&format!("blk.{l}.ffn_gate_inp.weight")))
            .collect();
        if !layers.contains(&true) {
            return fail(format!(
                "{} {num_experts}, but no layer has a router (blk.N.ffn_gate_inp.weight)",
                key("expert_count")
            ));
        }
        Ok(Some(MoeConfig {
            num_experts,
            top_k,
            intermediate_size,
            norm_topk_prob: norm,
            layers,
            names: self.names,
            // gpt-oss: llama.cpp fixes the gate's clamp, as its files state none.
            biases: self.clamped_with_biases.is_some(),
            clamped_swiglu: self.clamped_with_biases,
            sigmoid_router: match sigmoid {
                true => Some(SigmoidRouter {
                    groups: gguf.usize_opt("expert_group_count")?.unwrap_or(1),
                    top_groups: gguf.usize_opt("expert_group_used_count")?.unwrap_or(1),
                    scale: scale.unwrap_or(1.0),
                }),
                false => None,
            },
            shared_intermediate_size: shared.map(|n| n * intermediate_size),
            fields: MoeFields {
                num_experts: key("expert_count"),
                top_k: key("expert_used_count"),
                intermediate_size: intermediate_field,
            },
        }))
    }

    /// Whether the router is a sigmoid, checking `<arch>.expert_gating_func` against the
    /// family's router: a softmax family takes llama.cpp's softmax values (gpt-oss also
    /// its softmax over the chosen logits, the renormalised softmax of the others); a
    /// sigmoid family its sigmoid, which llama.cpp assumes where a file says nothing.
    fn sigmoid(&self, gguf: &Gguf<'_>) -> Result<bool> {
        let gating = gguf.usize_opt("expert_gating_func")?;
        let sigmoid_family = self.router == GgufRouter::Sigmoid;
        let sigmoid = sigmoid_family && matches!(gating, None | Some(0) | Some(GATING_SIGMOID));
        let of_chosen = self.router == GgufRouter::SoftmaxOfChosen;
        if let Some(gating) = gating.filter(|g| {
            !(sigmoid
                || (!sigmoid_family && GATING_SOFTMAX.contains(g))
                || (of_chosen && *g == GATING_SOFTMAX_WEIGHT))
        }) {
            return Err(EngineError::Config(format!(
                "{} {gating}: {} files are read with the {} router only",
                gguf.key("expert_gating_func"),
                gguf.arch(),
                if sigmoid_family {
                    "sigmoid (2)"
                } else {
                    "softmax (1)"
                }
            )));
        }
        Ok(sigmoid)
    }
}
