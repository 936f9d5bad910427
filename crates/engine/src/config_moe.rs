//! Mixture-of-experts settings: which layers hold experts, how many, how the router's
//! choices are weighted, and the tensor names of the family. Read from a Hugging Face
//! `config.json` here (Qwen3-MoE, Mixtral) and from GGUF metadata by the GGUF loader.
//!
//! Every refusal names the field of the file it came from (`num_experts_per_tok`,
//! `qwen3moe.expert_used_count`, ...), which [`MoeFields`] carries to the checks that run
//! later (the expert split of a tensor-parallel plan).

use super::HfConfig;
use crate::error::{EngineError, Result};

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
        super::layer_name(layer, &suffix)
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
    pub(super) fn new(num_experts: &str, top_k: &str, intermediate_size: &str) -> Self {
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

impl HfConfig {
    /// The router must be the softmax both families use; a config that says otherwise
    /// (`scoring_func`, as DeepSeek's sigmoid router) is refused rather than misread.
    pub(super) fn check_router_scoring(&self, family: &str) -> Result<()> {
        match self.scoring_func.as_deref() {
            None | Some("softmax") => Ok(()),
            Some(other) => Err(EngineError::Config(format!(
                "{family}: scoring_func '{other}' is not supported (the router is a softmax)"
            ))),
        }
    }

    /// Qwen3-MoE's experts and which layers hold them: every `decoder_sparse_step`-th
    /// layer not listed in `mlp_only_layers`. Each bad field is refused by name.
    pub(super) fn qwen3_moe(&self) -> Result<MoeConfig> {
        let fail = |m: String| Err(EngineError::Config(m));
        self.check_router_scoring("qwen3_moe")?;
        let Some(num_experts) = self.num_local_experts.or(self.num_experts) else {
            return fail("qwen3_moe: num_experts (num_local_experts) is missing".into());
        };
        let Some(top_k) = self.num_experts_per_tok else {
            return fail("qwen3_moe: num_experts_per_tok is missing".into());
        };
        let Some(intermediate_size) = self.moe_intermediate_size else {
            return fail("qwen3_moe: moe_intermediate_size is missing".into());
        };
        let step = self.decoder_sparse_step.unwrap_or(1);
        if step == 0 {
            return fail("decoder_sparse_step must be at least 1".into());
        }
        let dense = self.mlp_only_layers.clone().unwrap_or_default();
        if let Some(bad) = dense.iter().find(|l| **l >= self.num_hidden_layers) {
            return fail(format!(
                "mlp_only_layers names layer {bad} of a {}-layer model",
                self.num_hidden_layers
            ));
        }
        let layers = (0..self.num_hidden_layers)
            .map(|l| num_experts > 0 && !dense.contains(&l) && (l + 1) % step == 0)
            .collect();
        let experts_field = if self.num_local_experts.is_some() {
            "num_local_experts"
        } else {
            "num_experts"
        };
        Ok(MoeConfig {
            num_experts,
            top_k,
            intermediate_size,
            norm_topk_prob: self.norm_topk_prob.unwrap_or(false),
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
pub(super) mod tests {
    use super::*;
    use crate::config::ModelConfig;

    /// A config.json of `base` with `change` applied, read as Tessera reads it.
    pub(in crate::config) fn read(
        mut json: serde_json::Value,
        change: serde_json::Value,
    ) -> Result<ModelConfig> {
        if let (Some(base), Some(extra)) = (json.as_object_mut(), change.as_object()) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value::<HfConfig>(json)
            .map_err(|e| EngineError::Config(e.to_string()))?
            .into_model_config()
    }

    fn qwen3_moe(change: serde_json::Value) -> Result<ModelConfig> {
        read(
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

    fn mixtral(change: serde_json::Value) -> Result<ModelConfig> {
        read(
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
