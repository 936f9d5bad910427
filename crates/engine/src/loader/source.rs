//! What the model code reads weights through: a [`TensorSource`] answers for canonical
//! Hugging Face tensor names (`model.layers.3.self_attn.q_proj.weight`) whatever file
//! holds them, and keeps the token embedding in the file's representation.

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

use crate::error::{EngineError, Result};
use crate::loader::matrix::Matrix;
use crate::spec::model::ModelConfig;

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
    /// The size of a 2-D weight as stored, for planning where layers go before any is
    /// loaded. Readers answer from the file's metadata where they can; this default
    /// reads the weight.
    fn stored_size(&self, name: &str) -> Result<StoredSize> {
        Ok(StoredSize::of(&self.matrix(name)?))
    }
}

/// The LM head's weight: its own, or the embedding's where the two are tied.
pub(crate) fn lm_head_name(source: &dyn TensorSource) -> &'static str {
    if source.contains("lm_head.weight") && !source.config().tie_word_embeddings {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    }
}

/// A weight's size as stored: its elements, and for a quantized weight its bytes, which
/// every device keeps as they are (a dense weight takes the device's compute type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredSize {
    pub elements: usize,
    /// Bytes of a quantized weight; `None` for a dense one.
    pub quantized_bytes: Option<usize>,
}

impl StoredSize {
    pub fn of(m: &Matrix) -> StoredSize {
        match m {
            Matrix::Quantized {
                rows, cols, data, ..
            } => StoredSize {
                elements: rows * cols,
                quantized_bytes: Some(data.len()),
            },
            Matrix::Dense { weight, .. } => StoredSize::dense(weight.elem_count()),
        }
    }

    pub fn dense(elements: usize) -> StoredSize {
        StoredSize {
            elements,
            quantized_bytes: None,
        }
    }

    /// Bytes on a device whose dense weights take `dense_bytes` per element.
    pub fn bytes(&self, dense_bytes: usize) -> usize {
        self.quantized_bytes.unwrap_or(self.elements * dense_bytes)
    }

    /// `part` of `whole` rows of this weight (a projection read out of a fused one).
    pub fn rows(&self, part: usize, whole: usize) -> StoredSize {
        let share = |n: usize| n * part / whole.max(1);
        StoredSize {
            elements: share(self.elements),
            quantized_bytes: self.quantized_bytes.map(share),
        }
    }
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
                    .to_dtype(crate::device::dtype::compute_dtype(device))?,
            )),
        }
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
