//! SmolLM3: the llama layer with every fourth layer adding no position embedding.

/// SmolLM3 leaves every fourth layer without RoPE (`no_rope_layer_interval`; llama.cpp
/// fixes it at 4 for smollm3 files).
pub(crate) const SMOLLM3_NOPE_INTERVAL: usize = 4;

/// Which of `layers` layers add no position embedding when every `interval`-th does not.
pub(crate) fn every_nth_layer(layers: usize, interval: usize) -> Vec<bool> {
    (0..layers)
        .map(|i| interval != 0 && (i + 1) % interval == 0)
        .collect()
}
