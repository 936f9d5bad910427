//! A Hugging Face `config.json` ([`HfConfig`]): the fields Tessera reads, and the
//! [`ModelConfig`] they describe, for the llama family, Qwen2/3, Gemma 3, Mistral and the
//! mixtures of experts (whose part is `config_moe.rs`).

use serde::Deserialize;

use super::{
    gemma3_sliding_layers, Activation, ModelConfig, RopeStyle, SlidingWindow,
    GEMMA3_SLIDING_PATTERN,
};
use crate::error::{EngineError, Result};

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
    #[serde(default)]
    pub(super) final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub(super) attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub(super) use_bidirectional_attention: bool,
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
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    4096
}

impl HfConfig {
    pub(crate) fn into_model_config(self) -> Result<ModelConfig> {
        let arch = self
            .model_type
            .clone()
            .or_else(|| self.architectures.first().cloned())
            .unwrap_or_default();
        let (architecture, default_bias) = match arch.as_str() {
            "llama" | "LlamaForCausalLM" => ("llama", false),
            "mistral" | "MistralForCausalLM" => ("mistral", false),
            "qwen2" | "Qwen2ForCausalLM" => ("qwen2", true),
            "qwen3" | "Qwen3ForCausalLM" => ("qwen3", false),
            "qwen3_moe" | "Qwen3MoeForCausalLM" => ("qwen3_moe", false),
            "mixtral" | "MixtralForCausalLM" => ("mixtral", false),
            "gemma3_text" | "Gemma3ForCausalLM" => ("gemma3", false),
            other => return Err(EngineError::UnknownArchitecture(other.to_string())),
        };
        if let Some(scaling) = &self.rope_scaling {
            if !scaling.is_null() {
                return Err(EngineError::Config(format!(
                    "rope_scaling {scaling} is not supported yet"
                )));
            }
        }
        let unsupported =
            |what: String| Err(EngineError::Config(format!("{what} is not supported yet")));
        let gemma = architecture == "gemma3";
        if let Some(act) = self
            .hidden_act
            .as_deref()
            .filter(|a| *a != "silu" && !gemma)
        {
            return unsupported(format!("hidden_act '{act}'"));
        }
        if self.use_sliding_window {
            return unsupported("sliding-window attention (use_sliding_window)".into());
        }
        if self.mlp_bias {
            return unsupported("mlp_bias".into());
        }
        let mut rope_theta = self.rope_theta.unwrap_or(10_000.0);
        if let (false, Some(params)) = (gemma, &self.rope_parameters) {
            if let Some(theta) = default_rope_theta(params, "rope_type")? {
                rope_theta = theta;
            }
        }
        let head_dim = self
            .head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1));
        let gemma_parts = if gemma {
            Some(self.gemma3(head_dim)?)
        } else {
            None
        };
        let mut config = ModelConfig {
            architecture: architecture.to_string(),
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta,
            rope_style: RopeStyle::Half,
            max_position_embeddings: self.max_position_embeddings,
            attention_bias: self.attention_bias.unwrap_or(default_bias),
            qk_norm: matches!(architecture, "qwen3" | "qwen3_moe"),
            sandwich_norms: false,
            norm_weight_offset: 0.0,
            embed_scale: None,
            attention_scale: None,
            activation: Activation::Silu,
            sliding_window: None,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(gemma),
            moe: match architecture {
                "qwen3_moe" => Some(self.qwen3_moe()?),
                "mixtral" => Some(self.mixtral()?),
                _ => None,
            },
        };
        // Mistral (7B v0.1) and Mixtral attend to their last `sliding_window` positions in
        // every layer; a window that covers the whole context changes nothing.
        if matches!(architecture, "mistral" | "mixtral") {
            if let Some(window) = self
                .sliding_window
                .filter(|w| *w < self.max_position_embeddings)
            {
                config.sliding_window = Some(SlidingWindow {
                    window,
                    layers: vec![true; self.num_hidden_layers],
                    rope_theta: config.rope_theta,
                });
            }
        }
        if let Some(g) = gemma_parts {
            config.rope_theta = g.rope_theta;
            // Checkpoints store gemma's norm weights less 1.
            config.norm_weight_offset = 1.0;
            config.attention_scale = g.attention_scale;
            config.set_gemma3_layers(g.sliding);
        }
        config.validate()?;
        Ok(config)
    }

    /// Gemma 3's RoPE bases (full and sliding layers), window, layer pattern and scaling.
    fn gemma3(&self, head_dim: usize) -> Result<GemmaParts> {
        let unsupported =
            |what: String| Err(EngineError::Config(format!("{what} is not supported yet")));
        for (name, cap) in [
            ("final_logit_softcapping", self.final_logit_softcapping),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
        ] {
            if cap.is_some_and(|c| c != 0.0) {
                return unsupported(name.to_string());
            }
        }
        if self.use_bidirectional_attention {
            return unsupported("use_bidirectional_attention".into());
        }
        if let Some(act) = self
            .hidden_activation
            .as_deref()
            .filter(|a| *a != "gelu_pytorch_tanh")
        {
            return unsupported(format!("hidden_activation '{act}'"));
        }
        // transformers 5: rope_parameters per layer type; 4: rope_theta and
        // rope_local_base_freq (with rope_scaling for the full-attention layers).
        let mut theta = [
            self.rope_theta.unwrap_or(1_000_000.0),
            self.rope_local_base_freq.unwrap_or(10_000.0),
        ];
        if let Some(params) = &self.rope_parameters {
            for (i, kind) in ["full_attention", "sliding_attention"].iter().enumerate() {
                let Some(p) = params.get(kind) else { continue };
                if let Some(t) =
                    default_rope_theta(p, &format!("rope_parameters.{kind}.rope_type"))?
                {
                    theta[i] = t;
                }
            }
        }
        let window = self
            .sliding_window
            .ok_or_else(|| EngineError::Config("gemma3 config has no sliding_window".into()))?;
        let layers: Vec<bool> = match &self.layer_types {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(EngineError::Config(format!(
                        "layer_types entry '{other}' is not supported"
                    ))),
                })
                .collect::<Result<_>>()?,
            None => gemma3_sliding_layers(
                self.num_hidden_layers,
                self.sliding_window_pattern
                    .unwrap_or(GEMMA3_SLIDING_PATTERN),
            ),
        };
        Ok(GemmaParts {
            rope_theta: theta[0],
            attention_scale: Some(
                1.0 / self.query_pre_attn_scalar.unwrap_or(head_dim as f64).sqrt() as f32,
            ),
            sliding: SlidingWindow {
                window,
                layers,
                rope_theta: theta[1],
            },
        })
    }
}

/// `rope_theta` of a transformers-5 `rope_parameters` entry, refusing any `rope_type` but
/// "default" (named as `field` in the error).
fn default_rope_theta(params: &serde_json::Value, field: &str) -> Result<Option<f32>> {
    if let Some(kind) = params
        .get("rope_type")
        .and_then(|t| t.as_str())
        .filter(|t| *t != "default")
    {
        return Err(EngineError::Config(format!(
            "{field} '{kind}' is not supported yet"
        )));
    }
    Ok(params
        .get("rope_theta")
        .and_then(|t| t.as_f64())
        .map(|t| t as f32))
}

/// What a gemma3 config adds to the llama layout.
struct GemmaParts {
    rope_theta: f32,
    attention_scale: Option<f32>,
    sliding: SlidingWindow,
}
