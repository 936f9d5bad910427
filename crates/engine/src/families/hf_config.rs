//! A Hugging Face `config.json` ([`HfConfig`]): the fields Tessera reads, and the
//! [`ModelConfig`] they describe, for the llama family, Qwen2/3, Gemma 2/3, Mistral, Phi-3,
//! SmolLM3, Granite, GLM-4, OLMo 2 and the mixtures of experts (Qwen3-MoE's,
//! Mixtral's, gpt-oss's, GLM-4.5's, MiniMax-M2's and OLMo 3's parts have files of their
//! own).

use serde::Deserialize;

use crate::error::{EngineError, Result};
use crate::families::gemma2::{
    gemma_sliding_layers, set_gemma_layers, GEMMA2_SLIDING_PATTERN, GEMMA3_SLIDING_PATTERN,
};
use crate::families::{minimax_m2, smollm3};
use crate::spec::model::{ModelConfig, RopeStyle, SlidingWindow};
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

    /// The architecture `model_type` (else the first of `architectures`) names.
    pub(crate) fn architecture(&self) -> Result<&'static str> {
        let arch = self
            .model_type
            .as_deref()
            .or_else(|| self.architectures.first().map(String::as_str))
            .unwrap_or_default();
        Ok(match arch {
            "llama" | "LlamaForCausalLM" => "llama",
            "mistral" | "MistralForCausalLM" => "mistral",
            "qwen2" | "Qwen2ForCausalLM" => "qwen2",
            "qwen3" | "Qwen3ForCausalLM" => "qwen3",
            "qwen3_moe" | "Qwen3MoeForCausalLM" => "qwen3_moe",
            "mixtral" | "MixtralForCausalLM" => "mixtral",
            "gemma3_text" | "Gemma3ForCausalLM" => "gemma3",
            "gemma2" | "Gemma2ForCausalLM" => "gemma2",
            "phi3" | "Phi3ForCausalLM" => "phi3",
            "smollm3" | "SmolLM3ForCausalLM" => "smollm3",
            "granite" | "GraniteForCausalLM" => "granite",
            "glm4" | "Glm4ForCausalLM" => "glm4",
            "olmo2" | "Olmo2ForCausalLM" => "olmo2",
            "olmo3" | "Olmo3ForCausalLM" => "olmo3",
            "gpt_oss" | "GptOssForCausalLM" => "gpt_oss",
            "glm4_moe" | "Glm4MoeForCausalLM" => "glm4_moe",
            "minimax_m2" | "MiniMaxM2ForCausalLM" => "minimax_m2",
            other => return Err(EngineError::UnknownArchitecture(other.to_string())),
        })
    }

    pub(crate) fn into_model_config(self) -> Result<ModelConfig> {
        let architecture = self.architecture()?;
        let default_bias = matches!(architecture, "qwen2" | "glm4" | "gpt_oss");
        let unsupported =
            |what: String| Err(EngineError::Config(format!("{what} is not supported yet")));
        let gemma = matches!(architecture, "gemma2" | "gemma3");
        // OLMo 3 is OLMo 2's layer with sliding windows.
        let olmo = matches!(architecture, "olmo2" | "olmo3");
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
        let minimax = architecture == "minimax_m2";
        if minimax {
            self.check_minimax_m2()?;
        }
        let default_theta = if minimax {
            minimax_m2::DEFAULT_ROPE_THETA
        } else {
            10_000.0
        };
        let (rope_theta, rope_scaling) = self.rope(self.rope_theta.unwrap_or(default_theta))?;
        let head_dim = self
            .head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1));
        let share = if minimax {
            Some(self.minimax_m2_rotary_share(head_dim)?)
        } else {
            self.rotary_share()?
        };
        let rotary_dim = match share {
            Some(factor) if !gemma => rope::rotary_dim(head_dim, factor)?,
            Some(factor) if factor != 1.0 => {
                return unsupported(format!("partial_rotary_factor {factor} in {architecture}"))
            }
            _ => head_dim,
        };
        let gemma_parts = if gemma {
            Some(self.gemma(architecture, head_dim)?)
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
            rotary_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta,
            rope_scaling,
            // GLM rotates neighbouring pairs.
            rope_style: match architecture {
                "glm4" => RopeStyle::Interleaved,
                _ => RopeStyle::Half,
            },
            max_position_embeddings: self.max_position_embeddings,
            attention_bias: self.attention_bias.unwrap_or(default_bias),
            qk_norm: matches!(architecture, "qwen3" | "qwen3_moe")
                || olmo
                || (architecture == "glm4_moe" && self.use_qk_norm.unwrap_or(false))
                || minimax,
            qk_norm_across_heads: olmo || minimax,
            input_norms: !olmo,
            // GLM-4 and OLMo 2: a norm after attention and after the MLP too.
            sandwich_norms: architecture == "glm4" || olmo,
            nope_layers: if architecture == "smollm3" {
                self.smollm3_nope_layers()?
            } else {
                Vec::new()
            },
            // transformers' default for both families.
            tie_word_embeddings: self
                .tie_word_embeddings
                .unwrap_or(gemma || architecture == "smollm3"),
            moe: match architecture {
                "qwen3_moe" => Some(self.qwen3_moe()?),
                "mixtral" => Some(self.mixtral()?),
                "gpt_oss" => Some(self.gpt_oss_experts()?),
                "glm4_moe" => Some(self.glm4_moe_experts()?),
                "minimax_m2" => Some(self.minimax_m2_experts()?),
                _ => None,
            },
            ..ModelConfig::default()
        };
        // Mistral (7B v0.1), Mixtral and Phi-3 (mini 4k: 2047) attend to their last
        // `sliding_window` positions in every layer; a window that covers the whole
        // context changes nothing.
        if matches!(architecture, "mistral" | "mixtral" | "phi3") {
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
        if architecture == "granite" {
            // transformers multiplies by each (the attention scores by the attention
            // multiplier in place of 1/√head_dim), 1 where the config has none.
            config.embed_scale = Some(self.embedding_multiplier.unwrap_or(1.0));
            config.attention_scale = Some(self.attention_multiplier.unwrap_or(1.0));
            config.residual_multiplier = Some(self.residual_multiplier.unwrap_or(1.0));
            config.logits_scaling = Some(self.logits_scaling.unwrap_or(1.0));
        }
        if architecture == "gpt_oss" {
            self.set_gpt_oss_attention(&mut config)?;
        }
        if architecture == "olmo3" {
            self.set_olmo3_layers(&mut config)?;
        }
        if let Some(g) = gemma_parts {
            config.rope_theta = g.rope_theta;
            config.rope_scaling = g.rope_scaling;
            // Checkpoints store gemma's norm weights less 1.
            config.norm_weight_offset = 1.0;
            config.attention_scale = g.attention_scale;
            config.attn_logit_softcapping = g.softcaps[0];
            config.final_logit_softcapping = g.softcaps[1];
            set_gemma_layers(&mut config, g.sliding);
        }
        config.validate()?;
        Ok(config)
    }

    /// The RoPE base and scaling of a config whose layers all rotate alike: transformers
    /// 5's flat `rope_parameters`, or transformers 4's `rope_theta` (else `theta`) and
    /// `rope_scaling`. Gemma 3's per-layer-type `rope_parameters` are read by `gemma`.
    fn rope(&self, theta: f32) -> Result<(f32, RopeScaling)> {
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

    /// SmolLM3's layers without RoPE: `no_rope_layers` holds 1 for a layer that rotates
    /// and 0 for one that does not (transformers' naming); absent, every
    /// `no_rope_layer_interval`-th layer (4) does not.
    fn smollm3_nope_layers(&self) -> Result<Vec<bool>> {
        match &self.no_rope_layers {
            Some(rotates) if rotates.len() != self.num_hidden_layers => {
                Err(EngineError::Config(format!(
                    "no_rope_layers lists {} layers of a {}-layer model",
                    rotates.len(),
                    self.num_hidden_layers
                )))
            }
            Some(rotates) => Ok(rotates.iter().map(|r| *r == 0).collect()),
            None => Ok(smollm3::every_nth_layer(
                self.num_hidden_layers,
                self.no_rope_layer_interval
                    .unwrap_or(smollm3::SMOLLM3_NOPE_INTERVAL),
            )),
        }
    }

    /// Gemma 2's caps on attention scores and final logits (transformers' defaults, 50
    /// and 30, where the keys are absent; `null` for none). Gemma 3 has none.
    fn gemma_softcaps(&self, arch: &str) -> Result<[Option<f32>; 2]> {
        let caps = [
            ("attn_logit_softcapping", self.attn_logit_softcapping, 50.0),
            (
                "final_logit_softcapping",
                self.final_logit_softcapping,
                30.0,
            ),
        ];
        let mut out = [None; 2];
        for (slot, (name, cap, default)) in out.iter_mut().zip(caps) {
            let cap = match (arch, cap) {
                ("gemma2", None) => Some(default),
                (_, None) => None,
                (_, Some(c)) => c.filter(|c| *c != 0.0),
            };
            if arch != "gemma2" && cap.is_some() {
                return Err(EngineError::Config(format!(
                    "{name} is not supported for {arch}"
                )));
            }
            *slot = cap.map(|c| c as f32);
        }
        Ok(out)
    }

    /// Gemma 2's and 3's RoPE bases (full and sliding layers), window, layer pattern,
    /// scaling and caps.
    fn gemma(&self, arch: &str, head_dim: usize) -> Result<GemmaParts> {
        let unsupported =
            |what: String| Err(EngineError::Config(format!("{what} is not supported yet")));
        let softcaps = self.gemma_softcaps(arch)?;
        if self.use_bidirectional_attention == Some(true) {
            return unsupported("use_bidirectional_attention".into());
        }
        if let Some(act) = self
            .hidden_activation
            .as_deref()
            .filter(|a| *a != "gelu_pytorch_tanh")
        {
            return unsupported(format!("hidden_activation '{act}'"));
        }
        // Gemma 2: every layer rotates alike. Gemma 3, transformers 5: rope_parameters per
        // layer type; 4: rope_theta and rope_local_base_freq, with rope_scaling for the
        // full-attention layers only.
        let gemma2 = arch == "gemma2";
        let full =
            self.rope(
                self.rope_theta
                    .unwrap_or(if gemma2 { 10_000.0 } else { 1_000_000.0 }),
            )?;
        let sliding = if gemma2 {
            full.clone()
        } else {
            (
                self.rope_local_base_freq.unwrap_or(10_000.0),
                RopeScaling::None,
            )
        };
        let [full, sliding] = self.layer_type_ropes(arch, [full, sliding])?;
        let window = self
            .sliding_window
            .ok_or_else(|| EngineError::Config(format!("{arch} config has no sliding_window")))?;
        let layers: Vec<bool> = match self.sliding_layer_types()? {
            Some(layers) => layers,
            None if gemma2 => gemma_sliding_layers(self.num_hidden_layers, GEMMA2_SLIDING_PATTERN),
            None => gemma_sliding_layers(
                self.num_hidden_layers,
                self.sliding_window_pattern
                    .unwrap_or(GEMMA3_SLIDING_PATTERN),
            ),
        };
        Ok(GemmaParts {
            softcaps,
            rope_theta: full.0,
            rope_scaling: full.1,
            attention_scale: Some(
                1.0 / self.query_pre_attn_scalar.unwrap_or(head_dim as f64).sqrt() as f32,
            ),
            sliding: SlidingWindow {
                window,
                layers,
                rope_theta: sliding.0,
                rope_scaling: sliding.1,
            },
        })
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

/// What a gemma config adds to the llama layout.
struct GemmaParts {
    /// Caps on attention scores and on the final logits (Gemma 2).
    softcaps: [Option<f32>; 2],
    rope_theta: f32,
    rope_scaling: RopeScaling,
    attention_scale: Option<f32>,
    sliding: SlidingWindow,
}

#[cfg(test)]
mod tests;

/// A config.json of `base` with `change` applied, read as Tessera reads it.
#[cfg(test)]
pub(super) fn read(mut base: serde_json::Value, change: serde_json::Value) -> Result<ModelConfig> {
    if let (Some(b), Some(extra)) = (base.as_object_mut(), change.as_object()) {
        for (k, v) in extra {
            b.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value::<HfConfig>(base)
        .map_err(|e| EngineError::Config(e.to_string()))?
        .into_model_config()
}
