//! A Hugging Face `config.json` ([`HfConfig`]): the fields Tessera reads, and what more
//! than one family reads from them alike (RoPE, the share of each head that rotates,
//! windows and layer types, the router's scoring). The model they describe is read by
//! `hf` and each family's file.

use serde::Deserialize;

use crate::error::{EngineError, Result};
use crate::spec::model::{ModelConfig, SlidingWindow};
use crate::spec::rope::{self, RopeScaling};

/// The fields of a Hugging Face `config.json` that Tessera reads.
#[derive(Debug, Deserialize)]
pub(crate) struct HfConfig {
    #[serde(default)]
    pub(super) architectures: Vec<String>,
    #[serde(default)]
    pub(super) model_type: Option<String>,
    pub(super) vocab_size: usize,
    pub(super) hidden_size: usize,
    pub(super) intermediate_size: usize,
    pub(super) num_hidden_layers: usize,
    pub(super) num_attention_heads: usize,
    #[serde(default)]
    pub(super) num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub(super) head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub(super) rms_norm_eps: f64,
    #[serde(default)]
    pub(super) rope_theta: Option<f32>,
    /// transformers 5 writes `{"rope_theta": .., "rope_type": ..}` here.
    #[serde(default)]
    pub(super) rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) hidden_act: Option<String>,
    #[serde(default)]
    pub(super) use_sliding_window: bool,
    #[serde(default)]
    pub(super) mlp_bias: bool,
    #[serde(default = "default_max_pos")]
    pub(super) max_position_embeddings: usize,
    #[serde(default)]
    pub(super) attention_bias: Option<bool>,
    #[serde(default)]
    pub(super) tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub(super) rope_scaling: Option<serde_json::Value>,
    /// SmolLM3: 1 for each layer that rotates, 0 for one without RoPE.
    #[serde(default)]
    pub(super) no_rope_layers: Option<Vec<u8>>,
    #[serde(default)]
    pub(super) no_rope_layer_interval: Option<usize>,
    /// The share of each head that rotates (Phi-4-mini: 0.75; transformers 5 moves it
    /// into `rope_parameters`).
    #[serde(default)]
    pub(super) partial_rotary_factor: Option<f64>,
    /// Phi-3's pretraining context, which its LongRoPE scaling stretches.
    #[serde(default)]
    pub(super) original_max_position_embeddings: Option<usize>,
    // Gemma 3.
    #[serde(default)]
    pub(super) hidden_activation: Option<String>,
    #[serde(default)]
    pub(super) query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    pub(super) sliding_window: Option<usize>,
    #[serde(default)]
    pub(super) sliding_window_pattern: Option<usize>,
    #[serde(default)]
    pub(super) layer_types: Option<Vec<String>>,
    /// transformers 4's RoPE base of gemma's sliding-window layers.
    #[serde(default)]
    pub(super) rope_local_base_freq: Option<f32>,
    /// Outer `None`: the key is absent (transformers' default applies); `Some(None)`:
    /// `null`, no cap.
    #[serde(default, deserialize_with = "present")]
    pub(super) final_logit_softcapping: Option<Option<f64>>,
    #[serde(default, deserialize_with = "present")]
    pub(super) attn_logit_softcapping: Option<Option<f64>>,
    #[serde(default)]
    pub(super) use_bidirectional_attention: Option<bool>,
    // Granite's four scalars (transformers' default for each: 1).
    #[serde(default)]
    pub(super) embedding_multiplier: Option<f32>,
    #[serde(default)]
    pub(super) attention_multiplier: Option<f32>,
    #[serde(default)]
    pub(super) residual_multiplier: Option<f32>,
    #[serde(default)]
    pub(super) logits_scaling: Option<f32>,
    // Mixtures of experts (Qwen3-MoE: transformers 5 writes num_local_experts, earlier
    // checkpoints num_experts; Mixtral: num_local_experts).
    #[serde(default)]
    pub(super) num_experts: Option<usize>,
    #[serde(default)]
    pub(super) num_local_experts: Option<usize>,
    #[serde(default)]
    pub(super) num_experts_per_tok: Option<usize>,
    #[serde(default)]
    pub(super) moe_intermediate_size: Option<usize>,
    #[serde(default)]
    pub(super) norm_topk_prob: Option<bool>,
    #[serde(default)]
    pub(super) decoder_sparse_step: Option<usize>,
    #[serde(default)]
    pub(super) mlp_only_layers: Option<Vec<usize>>,
    /// How a router scores experts where a config says (DeepSeek: "sigmoid"); both
    /// families here use a softmax.
    #[serde(default)]
    pub(super) scoring_func: Option<String>,
    // gpt-oss's expert gate.
    #[serde(default)]
    pub(super) swiglu_alpha: Option<f32>,
    #[serde(default)]
    pub(super) swiglu_limit: Option<f32>,
    // GLM-4.5's mixture (`n_routed_experts` in its checkpoints; transformers 5 also
    // writes `num_local_experts`).
    #[serde(default)]
    pub(super) n_routed_experts: Option<usize>,
    #[serde(default)]
    pub(super) n_shared_experts: Option<usize>,
    #[serde(default)]
    pub(super) first_k_dense_replace: Option<usize>,
    #[serde(default)]
    pub(super) n_group: Option<usize>,
    #[serde(default)]
    pub(super) topk_group: Option<usize>,
    #[serde(default)]
    pub(super) routed_scaling_factor: Option<f32>,
    #[serde(default)]
    pub(super) use_qk_norm: Option<bool>,
    /// GLM-4.5's multi-token-prediction layers, after the decoder layers.
    #[serde(default)]
    pub(super) num_nextn_predict_layers: Option<usize>,
    /// MiniMax-M2's multi-token-prediction modules (its published weights hold none).
    #[serde(default)]
    pub(super) num_mtp_modules: Option<usize>,
    // MiniMax-M2.
    /// Dimensions of each head that rotate (transformers 5 turns it into
    /// `partial_rotary_factor`).
    #[serde(default)]
    pub(super) rotary_dim: Option<usize>,
    /// "per_layer": query and key norms over all heads.
    #[serde(default)]
    pub(super) qk_norm_type: Option<String>,
    /// Per layer: 1 for softmax attention, 0 for MiniMax-01's lightning attention.
    #[serde(default)]
    pub(super) attn_type_list: Option<Vec<u8>>,
    #[serde(default)]
    pub(super) shared_intermediate_size: Option<usize>,
    #[serde(default)]
    pub(super) use_routing_bias: Option<bool>,
    /// How the checkpoint's weights are quantized, where they are (gpt-oss: `mxfp4`).
    #[serde(default)]
    pub(super) quantization_config: Option<serde_json::Value>,
}

/// A key that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<f64>>, D::Error> {
    Ok(Some(Option::<f64>::deserialize(d)?))
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    4096
}

impl HfConfig {
    /// The checkpoint's `quantization_config`, where it has one.
    pub(crate) fn quantization_config(&self) -> Option<&serde_json::Value> {
        self.quantization_config.as_ref()
    }

    /// The RoPE base and scaling of a config whose layers all rotate alike: transformers
    /// 5's flat `rope_parameters`, or transformers 4's `rope_theta` (else `theta`) and
    /// `rope_scaling`. Gemma 3's per-layer-type `rope_parameters` are read by its family.
    pub(super) fn rope(&self, theta: f32) -> Result<(f32, RopeScaling)> {
        let (max_pos, original) = (
            self.max_position_embeddings,
            self.original_max_position_embeddings,
        );
        let flat = self.flat_rope_parameters();
        let from_parameters = match flat {
            Some(p) => RopeScaling::from_hf(p, "rope_parameters", max_pos, original)?,
            None => RopeScaling::None,
        };
        let scaling = match (&from_parameters, &self.rope_scaling) {
            (RopeScaling::None, Some(s)) => {
                RopeScaling::from_hf(s, "rope_scaling", max_pos, original)?
            }
            _ => from_parameters,
        };
        let theta = flat
            .and_then(|p| p.get("rope_theta"))
            .and_then(|t| t.as_f64())
            .map_or(theta, |t| t as f32);
        Ok((theta, scaling))
    }

    /// transformers 5's `rope_parameters` when all layers share them (not Gemma 3's per
    /// layer type).
    fn flat_rope_parameters(&self) -> Option<&serde_json::Value> {
        self.rope_parameters
            .as_ref()
            .filter(|p| p.get("full_attention").is_none())
    }

    /// The share of each head that rotates: the flat `rope_parameters`' (transformers
    /// 5), else the top level's (transformers 4), as transformers resolves both.
    pub(super) fn rotary_share(&self) -> Result<Option<f64>> {
        let from_parameters = match self.flat_rope_parameters() {
            Some(p) => rope::partial_rotary_factor(p, "rope_parameters")?,
            None => None,
        };
        Ok(from_parameters.or(self.partial_rotary_factor))
    }

    /// The window of a family that attends to its last `sliding_window` positions in
    /// every layer (Mistral 7B v0.1, Mixtral, Phi-3 mini 4k: 2047), on `config`; a window
    /// that covers the whole context changes nothing.
    pub(super) fn window_in_every_layer(&self, config: &mut ModelConfig) {
        if let Some(window) = self
            .sliding_window
            .filter(|w| *w < self.max_position_embeddings)
        {
            config.sliding_window = Some(SlidingWindow {
                window,
                layers: vec![true; self.num_hidden_layers],
                rope_theta: config.rope_theta,
                rope_scaling: config.rope_scaling.clone(),
            });
        }
    }

    /// The router of `family` must be the softmax it uses; a config that says otherwise
    /// (`scoring_func`, as DeepSeek's sigmoid router) is refused rather than misread.
    pub(super) fn check_router_scoring(&self, family: &str) -> Result<()> {
        match self.scoring_func.as_deref() {
            None | Some("softmax") => Ok(()),
            Some(other) => Err(EngineError::Config(format!(
                "{family}: scoring_func '{other}' is not supported (the router is a softmax)"
            ))),
        }
    }

    /// The RoPE base and scaling of the full-attention and the sliding-window layers:
    /// `[full, sliding]` as given, each replaced by its entry of transformers 5's
    /// per-layer-type `rope_parameters` where the config has one.
    pub(super) fn layer_type_ropes(
        &self,
        arch: &str,
        mut ropes: [(f32, RopeScaling); 2],
    ) -> Result<[(f32, RopeScaling); 2]> {
        let Some(params) = &self.rope_parameters else {
            return Ok(ropes);
        };
        for (kind, rope) in ["full_attention", "sliding_attention"]
            .into_iter()
            .zip(ropes.iter_mut())
        {
            let Some(p) = params.get(kind) else { continue };
            let field = format!("rope_parameters.{kind}");
            if let Some(f) = rope::partial_rotary_factor(p, &field)?.filter(|f| *f != 1.0) {
                return Err(EngineError::Config(format!(
                    "{field}.partial_rotary_factor {f} is not supported in {arch}"
                )));
            }
            rope.1 = RopeScaling::from_hf(
                p,
                &field,
                self.max_position_embeddings,
                self.original_max_position_embeddings,
            )?;
            if let Some(t) = p.get("rope_theta").and_then(|t| t.as_f64()) {
                rope.0 = t as f32;
            }
        }
        Ok(ropes)
    }

    /// `layer_types` read as which layers slide, where the config lists them.
    pub(super) fn sliding_layer_types(&self) -> Result<Option<Vec<bool>>> {
        let Some(types) = &self.layer_types else {
            return Ok(None);
        };
        let layers = types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(EngineError::Config(format!(
                    "layer_types entry '{other}' is not supported"
                ))),
            })
            .collect::<Result<_>>()?;
        Ok(Some(layers))
    }
}
