//! Gemma 3 (`Gemma3ForCausalLM`, `model_type` `gemma3_text`; GGUF `gemma3`): Gemma 2's
//! layer (`gemma2.rs`) with each query and key head RMS-normalized, five windowed layers
//! to each global one, the windowed layers rotating with their own base (10000) and
//! unscaled, and no caps.

use crate::error::Result;
use crate::families::gemma2::{self, gemma_layers, scale_27b_scores, sliding_layers};
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::families::row::{HfDefaults, Layer, QkNorm, Row};
use crate::spec::family::Family;
use crate::spec::model::{ModelConfig, RopeStyle, SlidingWindow};
use crate::spec::rope::RopeScaling;

static GEMMA3: Family = Family {
    name: "gemma3",
    hf_names: &["gemma3_text", "Gemma3ForCausalLM"],
    gguf_names: &["gemma3"],
    tensors: gemma2::TENSORS,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &GEMMA3,
    layer: Layer {
        qk_norm: QkNorm::PerHead,
        ..gemma2::LAYER
    },
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Half,
    hf_defaults: HfDefaults {
        rope_theta: 1_000_000.0,
        attention_bias: false,
        tie_word_embeddings: true,
    },
    gguf_experts: None,
    from_hf,
    from_gguf,
    fixture: "tiny-gemma3",
};

/// Gemma 3 alternates five sliding-window layers with one global layer.
const GLOBAL_EVERY: usize = 6;

/// RoPE base of its sliding-window layers (transformers 4's `rope_local_base_freq` where
/// a config.json names none; GGUF files do not store it).
const SLIDING_ROPE_THETA: f32 = 10_000.0;

/// transformers 5 gives `rope_parameters` per layer type; transformers 4 `rope_theta` and
/// `rope_local_base_freq`, with `rope_scaling` for the full-attention layers only.
fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    let caps = gemma2::hf_caps(hf, "gemma3", None)?;
    gemma2::check(hf)?;
    let full = (config.rope_theta, config.rope_scaling.clone());
    let sliding = (
        hf.rope_local_base_freq.unwrap_or(SLIDING_ROPE_THETA),
        RopeScaling::None,
    );
    let [full, sliding] = hf.layer_type_ropes("gemma3", [full, sliding])?;
    let global_every = hf.sliding_window_pattern.unwrap_or(GLOBAL_EVERY);
    let window = gemma2::hf_window(hf, "gemma3", sliding, global_every)?;
    gemma2::hf_layers(hf, config, full, window, caps);
    Ok(())
}

/// As llama.cpp reads its files: every sixth layer global, the file's scaling the global
/// layers'.
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    let window = gguf.usize("attention.sliding_window")?;
    scale_27b_scores(config, 62);
    let sliding = SlidingWindow {
        window,
        layers: sliding_layers(config.num_layers, GLOBAL_EVERY),
        rope_theta: SLIDING_ROPE_THETA,
        rope_scaling: RopeScaling::None,
    };
    gemma_layers(config, sliding);
    Ok(())
}
