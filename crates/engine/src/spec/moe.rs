//! Mixture-of-experts settings: which layers hold experts, how many, how the router's
//! choices are weighted, and the tensor names of the family. Each family's reader in
//! `crate::families` makes them from a `config.json` or from GGUF metadata.
//!
//! Every refusal names the field of the file it came from (`num_experts_per_tok`,
//! `qwen3moe.expert_used_count`, ...), which [`MoeFields`] carries to the checks that run
//! later (the expert split of a tensor-parallel plan).

use crate::error::{EngineError, Result};
use crate::spec::tensor_names::layer_name;

/// Whose tensor names a mixture's weights carry (canonical Hugging Face names; the GGUF
/// loader maps both to llama.cpp's `ffn_*_exps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertNames {
    /// `mlp.gate`, `mlp.experts.E.{gate,up,down}_proj` (Qwen3-MoE).
    Qwen3Moe,
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.E.{w1,w3,w2}` (Mixtral).
    Mixtral,
    /// `mlp.router`, and Qwen3-MoE's expert names, which the safetensors loader reads
    /// from gpt-oss's stacked `mlp.experts.{gate_up,down}_proj` tensors.
    GptOss,
    /// Mixtral's names, with the router's correction bias beside the router
    /// (`block_sparse_moe.e_score_correction_bias`; MiniMax-M2).
    MiniMaxM2,
}

/// One tensor of a mixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertTensor {
    /// The router, `[experts, hidden]`.
    Router,
    /// Expert `e`'s gate projection (`w1`), `[intermediate, hidden]`.
    Gate(usize),
    /// Expert `e`'s up projection (`w3`), `[intermediate, hidden]`.
    Up(usize),
    /// Expert `e`'s down projection (`w2`), `[hidden, intermediate]`.
    Down(usize),
    /// The shared expert's projections (GLM-4.5), shaped like an expert's with the
    /// shared width.
    SharedGate,
    SharedUp,
    SharedDown,
    /// The router's per-expert correction bias of a sigmoid router, `[experts]`.
    ScoreCorrection,
}

impl ExpertNames {
    /// The canonical name of `tensor` in decoder layer `layer`.
    pub fn tensor(self, layer: usize, tensor: ExpertTensor) -> String {
        let (block, [gate, up, down]) = match self {
            ExpertNames::Qwen3Moe | ExpertNames::GptOss => {
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
            ExpertNames::Mixtral | ExpertNames::MiniMaxM2 => {
                ("block_sparse_moe", ["w1", "w3", "w2"])
            }
        };
        let router = match self {
            ExpertNames::GptOss => "router",
            _ => "gate",
        };
        let suffix = match tensor {
            ExpertTensor::Router => format!("{block}.{router}.weight"),
            ExpertTensor::Gate(e) => format!("{block}.experts.{e}.{gate}.weight"),
            ExpertTensor::Up(e) => format!("{block}.experts.{e}.{up}.weight"),
            ExpertTensor::Down(e) => format!("{block}.experts.{e}.{down}.weight"),
            ExpertTensor::SharedGate => format!("{block}.shared_experts.{gate}.weight"),
            ExpertTensor::SharedUp => format!("{block}.shared_experts.{up}.weight"),
            ExpertTensor::SharedDown => format!("{block}.shared_experts.{down}.weight"),
            ExpertTensor::ScoreCorrection if self == ExpertNames::MiniMaxM2 => {
                format!("{block}.e_score_correction_bias")
            }
            ExpertTensor::ScoreCorrection => format!("{block}.{router}.e_score_correction_bias"),
        };
        layer_name(layer, &suffix)
    }

    /// The bias beside `tensor`, where the family has biases ([`MoeConfig::biases`]).
    pub fn bias(self, layer: usize, tensor: ExpertTensor) -> String {
        let weight = self.tensor(layer, tensor);
        match weight.strip_suffix(".weight") {
            Some(stem) => format!("{stem}.bias"),
            None => weight,
        }
    }
}

/// gpt-oss's expert gate: `(clamp(up, ±limit) + 1) · g·σ(alpha·g)` with
/// `g = min(gate, limit)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClampedSwiglu {
    pub alpha: f32,
    pub limit: f32,
}

/// The names, in the model's own file, of the fields a [`MoeConfig`] was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeFields {
    pub num_experts: String,
    pub top_k: String,
    pub intermediate_size: String,
}

impl MoeFields {
    pub(crate) fn new(num_experts: &str, top_k: &str, intermediate_size: &str) -> Self {
        Self {
            num_experts: num_experts.into(),
            top_k: top_k.into(),
            intermediate_size: intermediate_size.into(),
        }
    }
}

/// A mixture-of-experts MLP (Qwen3-MoE, Mixtral): in the layers marked in `layers`, a
/// router picks `top_k` of `num_experts` SiLU-gated experts per token; the other layers
/// keep the dense MLP of the model's `intermediate_size`.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    /// Intermediate size of each expert (`moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub intermediate_size: usize,
    /// The chosen experts' probabilities are divided by their sum (`norm_topk_prob`;
    /// always for Mixtral).
    pub norm_topk_prob: bool,
    /// Per decoder layer: whether its MLP is the mixture.
    pub layers: Vec<bool>,
    pub names: ExpertNames,
    pub fields: MoeFields,
    /// The router and each expert's projections carry biases (gpt-oss).
    pub biases: bool,
    /// gpt-oss's clamped gate; `None`: `SiLU(gate) · up`.
    pub clamped_swiglu: Option<ClampedSwiglu>,
    /// GLM-4.5's router (sigmoid scores, grouped choice, scaled weights); `None`: a
    /// softmax over the router's logits.
    pub sigmoid_router: Option<SigmoidRouter>,
    /// The width of the shared expert every token passes through besides its routed ones
    /// (GLM-4.5: `moe_intermediate_size · n_shared_experts`), where the family has one.
    pub shared_intermediate_size: Option<usize>,
}

/// GLM-4.5's router (DeepSeek-V3's kind): each expert's score is the sigmoid of its
/// logit; the choice reads the score plus the expert's `e_score_correction_bias`, among
/// the experts of the `top_groups` best of `groups` equal groups (a group's worth: the sum
/// of its two best biased scores); the chosen experts weigh by their unbiased scores,
/// divided by their sum where `norm_topk_prob` says, times `scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SigmoidRouter {
    pub groups: usize,
    pub top_groups: usize,
    /// `routed_scaling_factor`.
    pub scale: f32,
}

/// Upper bound on the expert count, well above any published model.
const MAX_EXPERTS: usize = 1 << 12;

impl MoeConfig {
    /// Checks the relations the router and the expert split rely on; `max_width` bounds
    /// the intermediate size like the model's other widths.
    pub(crate) fn validate(&self, num_layers: usize, max_width: usize) -> Result<()> {
        let fail = |m: String| Err(EngineError::Config(m));
        let f = &self.fields;
        if self.num_experts == 0 || self.num_experts > MAX_EXPERTS {
            return fail(format!(
                "{} {} must be between 1 and {MAX_EXPERTS}",
                f.num_experts, self.num_experts
            ));
        }
        if self.top_k == 0 || self.top_k > self.num_experts {
            return fail(format!(
                "{} {} must be between 1 and {} ({})",
                f.top_k, self.top_k, f.num_experts, self.num_experts
            ));
        }
        if self.intermediate_size == 0 || self.intermediate_size > max_width {
            return fail(format!(
                "{} {} must be between 1 and {max_width}",
                f.intermediate_size, self.intermediate_size
            ));
        }
        if let Some(width) = self.shared_intermediate_size {
            if width == 0 || width > max_width {
                return fail(format!(
                    "the shared expert's width {width} must be between 1 and {max_width}"
                ));
            }
        }
        if let Some(r) = &self.sigmoid_router {
            r.validate(self.num_experts, self.top_k)?;
        }
        if self.layers.len() != num_layers {
            return fail(format!(
                "mixture-of-experts layer types: {} for {num_layers} layers",
                self.layers.len()
            ));
        }
        Ok(())
    }
}

impl SigmoidRouter {
    /// The groups split the experts evenly, and the kept groups hold at least `top_k`.
    fn validate(&self, num_experts: usize, top_k: usize) -> Result<()> {
        let fail = |m: String| Err(EngineError::Config(m));
        if self.groups == 0 || !num_experts.is_multiple_of(self.groups) {
            return fail(format!(
                "n_group {} must divide the {num_experts} routed experts",
                self.groups
            ));
        }
        if self.top_groups == 0 || self.top_groups > self.groups {
            return fail(format!(
                "topk_group {} must be between 1 and n_group {}",
                self.top_groups, self.groups
            ));
        }
        let kept = self.top_groups * (num_experts / self.groups);
        if top_k > kept {
            return fail(format!(
                "num_experts_per_tok {top_k} exceeds the {kept} experts of the topk_group \
                 {} groups kept",
                self.top_groups
            ));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return fail(format!(
                "routed_scaling_factor {} must be positive",
                self.scale
            ));
        }
        Ok(())
    }
}
