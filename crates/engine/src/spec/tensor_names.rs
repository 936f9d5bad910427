//! The canonical (Hugging Face) names the model code asks every source for: a GGUF file
//! and a safetensors folder both answer to them.

/// Canonical names of one decoder layer's tensors.
pub fn layer_name(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}
