//! Reading model files: GGUF (quantized) and Hugging Face safetensors folders.
//!
//! Both sources answer to canonical Hugging Face tensor names
//! (`model.layers.3.self_attn.q_proj.weight`) behind [`TensorSource`], so the model code
//! is written once.

pub(crate) mod blocks;
mod cache;
mod context_limit;
pub(crate) mod fp8;
mod fused;
mod gguf;
mod gguf_header;
mod gguf_names;
pub(crate) mod matrix;
mod mxfp4;
pub(crate) mod open;
pub(crate) mod quantization;
mod safetensors;
pub(crate) mod source;
mod stacked_experts;
mod tokenizer;
pub(crate) mod weight_bytes;

pub use cache::{cache_dir, default_model_path, DEFAULT_MODEL_FILE};
pub use gguf::{GgufHeader, GgufSource};
pub use gguf_header::read_gguf_header;
pub use gguf_names::gguf_name;
pub use matrix::Matrix;
pub use open::{open, open_served};
pub use safetensors::{tensors_from_bytes, SafetensorsSource};
pub use source::{Embedding, TensorSource};
pub use tokenizer::{check_vocabulary, load_tokenizer, tokenizer_from_metadata};
