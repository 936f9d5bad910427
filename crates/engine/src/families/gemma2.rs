//! Gemma 2 and what Gemma 3 shares with it: norms around attention and the MLP,
//! √hidden-scaled embeddings, a GELU MLP, and sliding-window layers in a fixed pattern.

use crate::spec::model::{Activation, ModelConfig, SlidingWindow};

/// Gemma 3 alternates five sliding-window layers with one global layer.
pub(crate) const GEMMA3_SLIDING_PATTERN: usize = 6;
/// Gemma 2 alternates a sliding-window layer with a global one.
pub(crate) const GEMMA2_SLIDING_PATTERN: usize = 2;

/// Which of `layers` layers slide when every `pattern`-th layer is global.
pub(crate) fn gemma_sliding_layers(layers: usize, pattern: usize) -> Vec<bool> {
    (0..layers)
        .map(|i| pattern != 0 && (i + 1) % pattern != 0)
        .collect()
}

/// Gemma 2's and 3's layer on top of the llama layout, the same from safetensors and
/// GGUF: norms around attention and the MLP, √hidden-scaled embeddings, a GELU MLP,
/// `sliding` for the window layers, and (Gemma 3) per-head q/k norms.
pub(crate) fn set_gemma_layers(config: &mut ModelConfig, sliding: SlidingWindow) {
    config.qk_norm = config.architecture == "gemma3";
    config.sandwich_norms = true;
    config.embed_scale = Some((config.hidden_size as f32).sqrt());
    config.activation = Activation::GeluTanh;
    config.sliding_window = Some(sliding);
}
