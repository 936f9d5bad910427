//! What a model is: the hyper-parameters and features the forward pass and the shard
//! plan read ([`ModelConfig`]), whichever file and family they came from, and the checks
//! that keep a file from asking for more than a real model needs.

use crate::error::{EngineError, Result};
use crate::spec::family::{Family, UNNAMED};
use crate::spec::moe::MoeConfig;
use crate::spec::rope::RopeScaling;

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i+1)`: llama GGUF files (their Q/K rows are permuted for it).
    Interleaved,
    /// Pairs `(i, i + d/2)` of the `d` rotated dimensions: Hugging Face checkpoints and
    /// qwen2 GGUF files.
    Half,
}

/// The activation of the gated MLP: `act(gate) · up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SiLU (llama, qwen).
    #[default]
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`: gemma).
    GeluTanh,
}

/// Sliding-window attention: layers marked in `layers` attend to their last `window`
/// positions only (a token at position p sees keys p - window + 1 ..= p) and rotate with
/// their own RoPE base.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// Per decoder layer: whether it is a sliding-window layer.
    pub layers: Vec<bool>,
    /// RoPE base of the sliding-window layers.
    pub rope_theta: f32,
    /// RoPE scaling of the sliding-window layers (gemma 3 scales its global layers only).
    pub rope_scaling: RopeScaling,
}

/// Architecture hyper-parameters that the forward pass and the shard plan need.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family whose files the model was read from.
    pub family: &'static Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// How many of each head's first dimensions rotate (Phi-4-mini: 96 of 128); the rest
    /// pass through unrotated. `head_dim` for most models.
    pub rotary_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    /// How the rotary frequencies are stretched for long contexts (of the layers that do
    /// not slide, where a model has sliding-window layers).
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    pub max_position_embeddings: usize,
    /// Attention Q/K/V projections carry a bias (qwen2).
    pub attention_bias: bool,
    /// Each query and key head is RMS-normalized (weights of `head_dim`) before RoPE
    /// (qwen3, gemma3).
    pub qk_norm: bool,
    /// With `qk_norm`: the norms span all of a token's query heads and all its key heads
    /// (OLMo 2: weights of heads · head_dim), not each head on its own.
    pub qk_norm_across_heads: bool,
    /// Each layer half normalizes its input (`input_layernorm`, the MLP's input norm);
    /// false for OLMo 2, which normalizes the halves' outputs only.
    pub input_norms: bool,
    /// Gemma's and GLM-4's layer: RMSNorm also after attention and after the MLP (before
    /// each residual add); see [`ModelConfig::sandwich_norm_names`].
    pub sandwich_norms: bool,
    /// Added to every RMSNorm weight at load: gemma checkpoints store `w - 1` and scale by
    /// `1 + w` (its GGUF files have the 1 added already).
    pub norm_weight_offset: f32,
    /// Token embeddings are multiplied by this (gemma: √hidden).
    pub embed_scale: Option<f32>,
    /// Attention scores are multiplied by this; `None`: 1/√head_dim.
    pub attention_scale: Option<f32>,
    /// Gemma 2: scaled attention scores become `cap · tanh(score / cap)`.
    pub attn_logit_softcapping: Option<f32>,
    /// Gemma 2: the final logits become `cap · tanh(logit / cap)`.
    pub final_logit_softcapping: Option<f32>,
    /// Granite: each layer's attention and MLP outputs are multiplied by this before
    /// they are added to the residual stream.
    pub residual_multiplier: Option<f32>,
    /// Granite: the final logits are divided by this.
    pub logits_scaling: Option<f32>,
    /// gpt-oss: each query head has a learned sink logit (`self_attn.sinks`) that joins
    /// its softmax's denominator and attends to nothing, so a head can attend to little.
    pub attention_sinks: bool,
    /// The attention output projection carries a bias (gpt-oss).
    pub attention_out_bias: bool,
    pub activation: Activation,
    pub sliding_window: Option<SlidingWindow>,
    /// Per decoder layer: whether it adds no position embedding (SmolLM3's every fourth
    /// layer): its queries and keys are not rotated. Empty: every layer rotates.
    pub nope_layers: Vec<bool>,
    /// The LM head reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// Mixture-of-experts MLPs (Qwen3-MoE), where the model has them.
    pub moe: Option<MoeConfig>,
    /// Multi-token-prediction layers the checkpoint declares after its decoder layers
    /// (GLM-4.5's `num_nextn_predict_layers`); read only for `mtp` speculation.
    pub prediction_layers: usize,
}

impl ModelConfig {
    /// Whether decoder layer `layer`'s MLP is a mixture of experts.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| m.layers.get(layer).copied().unwrap_or(false))
    }

    /// The model served with at most `max_len` positions (`--max-model-len`): a context
    /// beyond the model's own is refused, since its position embeddings were never
    /// trained there.
    pub fn limit_context(&mut self, max_len: usize) -> Result<()> {
        if max_len == 0 || max_len > self.max_position_embeddings {
            return Err(EngineError::Config(format!(
                "--max-model-len {max_len} must be between 1 and the model's context of {}",
                self.max_position_embeddings
            )));
        }
        self.max_position_embeddings = max_len;
        Ok(())
    }

    /// For the load log: `base 10000, LongRoPE (...), its long factors (context 131072
    /// past the 4096 trained), 96 of 128 dimensions rotated` and the like.
    pub fn rope_summary(&self) -> String {
        let mut s = format!("base {}, {}", self.rope_theta, self.rope_scaling);
        if let RopeScaling::LongRope(l) = &self.rope_scaling {
            let context = self.max_position_embeddings;
            s += &match l.uses_long_factors(context) {
                true => format!(
                    ", its long factors (context {context} past the {} trained)",
                    l.original_context
                ),
                false => format!(
                    ", its short factors (context {context} within the {} trained; a \
                     longer --max-model-len takes the long ones)",
                    l.original_context
                ),
            };
        }
        if self.rotary_dim != self.head_dim {
            s += &format!(
                ", {} of {} dimensions rotated",
                self.rotary_dim, self.head_dim
            );
        }
        s
    }

    /// The names of a sandwich-norm layer's norms after its input norm: the MLP's input
    /// norm, the norm after attention and the norm after the MLP, as its family names
    /// them.
    pub fn sandwich_norm_names(&self) -> [&'static str; 3] {
        self.family.tensors.sandwich_norms
    }

    /// Query heads that share one KV head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Checks the relations the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        let fail = |m: String| Err(EngineError::Config(m));
        if self.num_layers == 0 || self.hidden_size == 0 || self.vocab_size == 0 {
            return fail(format!(
                "layers ({}), hidden size ({}) and vocabulary ({}) must be non-zero",
                self.num_layers, self.hidden_size, self.vocab_size
            ));
        }
        if self.num_heads == 0 || self.num_kv_heads == 0 {
            return fail("attention head counts must be non-zero".into());
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return fail(format!(
                "{} attention heads are not a multiple of {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return fail(format!("head dimension {} must be even", self.head_dim));
        }
        // Sizes that allocate before any tensor is read and checked against them (the
        // rotary table alone is context × head dimension floats): a model file must not
        // be able to ask for more than a real model needs.
        for (name, value, max) in [
            ("vocabulary", self.vocab_size, MAX_VOCAB),
            ("hidden size", self.hidden_size, MAX_WIDTH),
            ("intermediate size", self.intermediate_size, MAX_WIDTH),
            ("layer count", self.num_layers, MAX_LAYERS),
            ("attention head count", self.num_heads, MAX_HEADS),
            ("head dimension", self.head_dim, MAX_HEAD_DIM),
            ("context length", self.max_position_embeddings, MAX_CONTEXT),
        ] {
            if value > max {
                return fail(format!("{name} {value} is above the supported {max}"));
            }
        }
        if let Some(sw) = &self.sliding_window {
            if sw.window == 0 || sw.layers.len() != self.num_layers {
                return fail(format!(
                    "sliding window of {} over {} layer types for {} layers",
                    sw.window,
                    sw.layers.len(),
                    self.num_layers
                ));
            }
            if !(sw.rope_theta.is_finite() && sw.rope_theta > 0.0) {
                return fail(format!(
                    "sliding-window rope theta {} must be positive",
                    sw.rope_theta
                ));
            }
        }
        if !self.nope_layers.is_empty() && self.nope_layers.len() != self.num_layers {
            return fail(format!(
                "{} layers without RoPE listed for {} layers",
                self.nope_layers.len(),
                self.num_layers
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return fail(format!("rope theta {} must be positive", self.rope_theta));
        }
        for (name, cap) in [
            ("attention logit softcapping", self.attn_logit_softcapping),
            ("final logit softcapping", self.final_logit_softcapping),
            ("residual multiplier", self.residual_multiplier),
            ("logits scaling", self.logits_scaling),
            ("embedding multiplier", self.embed_scale),
            ("attention multiplier", self.attention_scale),
        ] {
            if cap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                return fail(format!("{name} {cap:?} must be positive"));
            }
        }
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            return fail(format!(
                "{} rotated dimensions of a head of {}: they must be even and at most the head",
                self.rotary_dim, self.head_dim
            ));
        }
        self.rope_scaling.validate(self.rotary_dim).or_else(fail)?;
        if let Some(sw) = &self.sliding_window {
            sw.rope_scaling.validate(self.rotary_dim).or_else(fail)?;
        }
        if let Some(moe) = &self.moe {
            moe.validate(self.num_layers, MAX_WIDTH)?;
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return fail(format!(
                "RMSNorm epsilon {} must be >= 0",
                self.rms_norm_eps
            ));
        }
        Ok(())
    }
}

/// Llama's layout with no sizes, as a reader starts from: unscaled RoPE pairing the
/// halves of each head, input norms only, a SiLU MLP, no biases, query/key norms, windows,
/// caps or scalars, every layer rotating, an untied LM head and a dense MLP. Readers set
/// the sizes and what their family adds.
impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            family: &UNNAMED,
            vocab_size: 0,
            hidden_size: 0,
            intermediate_size: 0,
            num_layers: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            rotary_dim: 0,
            rms_norm_eps: 1e-5,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::None,
            rope_style: RopeStyle::Half,
            max_position_embeddings: 4096,
            attention_bias: false,
            qk_norm: false,
            qk_norm_across_heads: false,
            input_norms: true,
            sandwich_norms: false,
            norm_weight_offset: 0.0,
            embed_scale: None,
            attention_scale: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            residual_multiplier: None,
            logits_scaling: None,
            attention_sinks: false,
            attention_out_bias: false,
            activation: Activation::Silu,
            sliding_window: None,
            nope_layers: Vec::new(),
            tie_word_embeddings: false,
            moe: None,
            prediction_layers: 0,
        }
    }
}

/// Upper bounds of [`ModelConfig::validate`], each well above any published model.
const MAX_VOCAB: usize = 1 << 22;
const MAX_WIDTH: usize = 1 << 18;
const MAX_LAYERS: usize = 1024;
const MAX_HEADS: usize = 1024;
const MAX_HEAD_DIM: usize = 1024;
const MAX_CONTEXT: usize = 1 << 21;

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> ModelConfig {
        ModelConfig {
            vocab_size: 49152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            rotary_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 100_000.0,
            rope_style: RopeStyle::Interleaved,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            ..ModelConfig::default()
        }
    }

    #[test]
    fn sizes_beyond_any_real_model_are_refused_by_name() {
        assert!(smollm2().validate().is_ok());
        type Change = fn(&mut ModelConfig);
        let cases: [(Change, &str); 6] = [
            (|c| c.max_position_embeddings = 1 << 40, "context length"),
            (|c| c.hidden_size = 1 << 30, "hidden size"),
            (|c| c.num_layers = 1_000_000, "layer count"),
            (|c| c.rope_theta = f32::NAN, "rope theta"),
            (|c| c.rms_norm_eps = -1.0, "epsilon"),
            (|c| c.rotary_dim = 66, "rotated dimensions"),
        ];
        for (change, name) in cases {
            let mut c = smollm2();
            change(&mut c);
            match c.validate() {
                Err(EngineError::Config(m)) => assert!(m.contains(name), "{m}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}
