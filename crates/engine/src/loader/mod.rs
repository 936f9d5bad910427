//! Reading model files: GGUF (quantized) and Hugging Face safetensors folders.
//!
//! Both sources answer to canonical Hugging Face tensor names
//! (`model.layers.3.self_attn.q_proj.weight`), so the model code is written once.

mod cache;
mod context_limit;
pub(crate) mod fp8;
mod fused;
mod gguf;
mod gguf_config;
mod gguf_header;
mod gguf_names;
mod matrix;
mod mxfp4;
mod safetensors;
mod stacked_experts;
mod tokenizer;

use std::path::Path;

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

pub use cache::{cache_dir, default_model_path, DEFAULT_MODEL_FILE};
pub use gguf::{GgufHeader, GgufSource};
pub use gguf_header::read_gguf_header;
pub use gguf_names::gguf_name;
pub use matrix::Matrix;
pub use safetensors::{tensors_from_bytes, SafetensorsSource};
pub use tokenizer::{check_vocabulary, load_tokenizer, tokenizer_from_metadata};

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};

/// Where the weights of a model come from.
pub trait TensorSource: Send + Sync {
    fn config(&self) -> &ModelConfig;
    /// A whole 2-D weight by canonical name.
    fn matrix(&self, name: &str) -> Result<Matrix>;
    /// A 1-D tensor (norm weight, bias) as f32 on the CPU.
    fn vector(&self, name: &str) -> Result<Tensor>;
    fn contains(&self, name: &str) -> bool;
    /// Quantization block (in columns) of a 2-D weight, from the file's metadata alone
    /// (1 for dense weights).
    fn block_cols(&self, name: &str) -> Result<usize>;
    /// The token embedding table, kept in the file's representation.
    fn embedding(&self) -> Result<Embedding>;
}

/// Token embedding lookup. Quantized tables dequantize only the rows looked up.
#[derive(Debug, Clone)]
pub enum Embedding {
    Quantized(std::sync::Arc<QTensor>),
    Dense(Tensor),
}

impl Embedding {
    /// Rows for `ids` (u32, shape `[n]`) as f32 `[n, hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Embedding::Quantized(q) => Ok(q.embedding(ids)?),
            Embedding::Dense(w) => Ok(w.index_select(ids, 0)?),
        }
    }

    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Embedding::Quantized(q) => Ok(q.shape().dims2()?),
            Embedding::Dense(w) => Ok(w.dims2()?),
        }
    }

    /// The same table on another device.
    pub fn to_device(&self, device: &Device) -> Result<Embedding> {
        if device.is_cpu() {
            return Ok(self.clone());
        }
        match self {
            Embedding::Quantized(q) => {
                let data = q.data()?;
                let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                    q.dtype(),
                    &data,
                    q.shape().dims().to_vec(),
                    device,
                )?;
                Ok(Embedding::Quantized(std::sync::Arc::new(q)))
            }
            Embedding::Dense(w) => Ok(Embedding::Dense(
                w.to_device(device)?
                    .to_dtype(crate::model::compute_dtype(device))?,
            )),
        }
    }
}

/// Opens a model: a `.gguf` file, or a folder with `config.json` and safetensors.
pub fn open(path: &Path) -> Result<Box<dyn TensorSource>> {
    if !path.exists() {
        return Err(EngineError::MissingFile(path.to_path_buf()));
    }
    let source: Box<dyn TensorSource> = if path.is_dir() {
        Box::new(SafetensorsSource::open(path)?)
    } else {
        Box::new(GgufSource::open(path)?)
    };
    Ok(Box::new(fused::FusedProjections::new(source)))
}

/// Opens a model as [`open`] does, to be served with at most `max_model_len` positions
/// where that is given.
pub fn open_served(path: &Path, max_model_len: Option<usize>) -> Result<Box<dyn TensorSource>> {
    let source = open(path)?;
    match max_model_len {
        Some(n) => Ok(Box::new(context_limit::ContextLimit::new(source, n)?)),
        None => Ok(source),
    }
}

/// The 1-D tensor `name` (f32 on the CPU), which must hold `len` values.
pub(crate) fn vector_of_len(source: &dyn TensorSource, name: &str, len: usize) -> Result<Tensor> {
    let v = source.vector(name)?;
    if v.dims1()? != len {
        return Err(EngineError::ShapeMismatch {
            name: name.to_string(),
            expected: vec![len],
            found: v.dims().to_vec(),
        });
    }
    Ok(v)
}

/// Canonical names of one decoder layer's tensors.
pub(crate) fn layer_name(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}

/// Largest quantization block of the row-parallel weights of every layer (their input
/// dimension is split; mixed-quantization files may differ per layer). Metadata only.
pub(crate) fn row_parallel_block(source: &dyn TensorSource, num_layers: usize) -> Result<usize> {
    let mut block = 1;
    let config = source.config();
    for layer in 0..num_layers {
        block = block.max(source.block_cols(&layer_name(layer, "self_attn.o_proj.weight"))?);
        block = block.max(match &config.moe {
            Some(moe) if config.is_moe_layer(layer) => {
                crate::model::moe::down_block(source, moe, layer)?
            }
            _ => source.block_cols(&layer_name(layer, "mlp.down_proj.weight"))?,
        });
    }
    Ok(block)
}
