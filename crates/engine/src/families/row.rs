//! One row of the family table ([`Row`]): a family, its layer as both formats state it,
//! and how each format states the rest. A family file fills one in.

use crate::error::Result;
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::spec::family::Family;
use crate::spec::model::{Activation, ModelConfig, RopeStyle};
use crate::spec::moe::{ClampedSwiglu, ExpertNames};

/// A family, and how its `config.json` files and its GGUF files describe a model of it.
pub(crate) struct Row {
    /// Who it is: its names in each format, its tensor-name quirks, its quantizations.
    pub family: &'static Family,
    /// The features of its layer, alike in both formats.
    pub layer: Layer,
    /// How a checkpoint's query and key rows pair the rotated dimensions.
    pub hf_rope_style: RopeStyle,
    /// How a GGUF file's do: llama.cpp's converter permutes some families' rows to pair
    /// neighbours.
    pub gguf_rope_style: RopeStyle,
    /// transformers' defaults where a `config.json` leaves a key out.
    pub hf_defaults: HfDefaults,
    /// The mixture of experts of its GGUF files, where they have one.
    pub gguf_experts: Option<GgufExperts>,
    /// The rest of a `config.json`'s model: what only this family reads, checks or
    /// refuses, on the model read so far.
    pub from_hf: fn(&HfConfig, &mut ModelConfig) -> Result<()>,
    /// The rest of a GGUF file's model.
    pub from_gguf: fn(&Gguf<'_>, &mut ModelConfig) -> Result<()>,
    /// The tiny model its tests load (`tests/fixtures/models/<fixture>`, with
    /// transformers' logits beside it); the table's test requires one per family.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fixture: &'static str,
}

/// The features of a family's layer that a `config.json` and a GGUF file state alike.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layer {
    pub qk_norm: QkNorm,
    /// Each layer half normalizes its input (OLMo 2 normalizes the halves' outputs
    /// only).
    pub input_norms: bool,
    /// RMSNorms also after attention and after the MLP (Gemma, GLM-4, OLMo 2).
    pub sandwich_norms: bool,
    pub activation: Activation,
    /// A head may rotate in part (`partial_rotary_factor`); Gemma's may not.
    pub partial_rotation: bool,
}

/// RMSNorms of the queries and keys before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QkNorm {
    None,
    /// Each head on its own (Qwen3, Gemma 3).
    PerHead,
    /// All of a token's query heads, and all its key heads (OLMo 2, MiniMax-M2).
    AcrossHeads,
}

impl Layer {
    /// Llama's layer: an RMSNorm before each half, a SiLU-gated MLP.
    pub const LLAMA: Layer = Layer {
        qk_norm: QkNorm::None,
        input_norms: true,
        sandwich_norms: false,
        activation: Activation::Silu,
        partial_rotation: true,
    };

    /// These features on `config`.
    pub(crate) fn apply(&self, config: &mut ModelConfig) {
        config.qk_norm = self.qk_norm != QkNorm::None;
        config.qk_norm_across_heads = self.qk_norm == QkNorm::AcrossHeads;
        config.input_norms = self.input_norms;
        config.sandwich_norms = self.sandwich_norms;
        config.activation = self.activation;
    }
}

/// transformers' defaults of a family's configuration class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HfDefaults {
    pub rope_theta: f32,
    pub attention_bias: bool,
    pub tie_word_embeddings: bool,
}

impl HfDefaults {
    pub const LLAMA: HfDefaults = HfDefaults {
        rope_theta: 10_000.0,
        attention_bias: false,
        tie_word_embeddings: false,
    };
}

/// A family's mixture of experts as llama.cpp's converter writes it: stacked
/// `ffn_*_exps` tensors, `<arch>.expert_*` keys, a router in each layer that has one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GgufExperts {
    pub names: ExpertNames,
    pub router: GgufRouter,
    /// A shared expert may stand beside the routed ones (`expert_shared_count`).
    pub shared_expert: bool,
    /// The router and the experts carry biases, and the gate is clamped as given.
    pub clamped_with_biases: Option<ClampedSwiglu>,
    /// Files of the architecture may have no experts (llama: only Mixtral's have), and
    /// state the experts' width as the dense `feed_forward_length` (llama.cpp's
    /// Mixtral).
    pub in_dense_files: bool,
}

/// How a GGUF family's router weighs its experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GgufRouter {
    /// A softmax over all experts' logits (llama.cpp's `expert_gating_func` 0 or 1).
    Softmax,
    /// A softmax over the chosen experts' logits (3), the renormalised softmax of the
    /// others, or the softmax itself (gpt-oss).
    SoftmaxOfChosen,
    /// Sigmoid scores with correction biases (2; assumed where a file says nothing).
    Sigmoid,
}

/// The `from_hf` of a family whose `config.json` states nothing more than its row.
pub(crate) fn nothing_more_hf(_: &HfConfig, _: &mut ModelConfig) -> Result<()> {
    Ok(())
}

/// The `from_gguf` of a family whose GGUF files state nothing more than its row.
pub(crate) fn nothing_more_gguf(_: &Gguf<'_>, _: &mut ModelConfig) -> Result<()> {
    Ok(())
}
