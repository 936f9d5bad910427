//! Fused projections read as the separate matrices the model asks for: Phi-3's
//! `self_attn.qkv_proj` (query, key and value rows stacked) and `mlp.gate_up_proj` (gate
//! rows, then up rows), and their GGUF forms `attn_qkv` and phi3's double-height
//! `ffn_up`. Each part is a range of whole rows, so quantized blocks are never cut, and
//! the tensor-parallel split then treats the parts as it treats separate tensors.

use std::ops::Range;
use std::sync::Mutex;

use candle_core::Tensor;

use crate::error::{EngineError, Result};
use crate::loader::matrix::Matrix;
use crate::loader::source::{Embedding, StoredSize, TensorSource};
use crate::spec::model::ModelConfig;

/// A source that answers for `q_proj`/`k_proj`/`v_proj` and `gate_proj`/`up_proj` from
/// a fused tensor where the file has no separate one.
pub(crate) struct FusedProjections {
    inner: Box<dyn TensorSource>,
    /// The fused matrix read last: the loader asks for its parts one after the other,
    /// so each fused tensor is read from the file once, not once per part.
    last: Mutex<Option<(String, Matrix)>>,
}

impl FusedProjections {
    pub(crate) fn new(inner: Box<dyn TensorSource>) -> Self {
        Self {
            inner,
            last: Mutex::new(None),
        }
    }

    /// The fused matrix `name`, from the last read when it was this one.
    fn fused_matrix(&self, name: &str) -> Result<Matrix> {
        // A poisoned lock only means a read panicked; the cache is then just empty.
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, matrix)) = last.as_ref().filter(|(n, _)| n == name) {
            return Ok(matrix.clone());
        }
        let matrix = self.inner.matrix(name)?;
        *last = Some((name.to_string(), matrix.clone()));
        Ok(matrix)
    }

    /// The fused tensor holding `name`, with the rows of `name` in it and the fused
    /// tensor's total rows; `None` for tensors that are never fused.
    fn part(&self, name: &str) -> Option<(String, Range<usize>, usize)> {
        let c = self.inner.config();
        let (prefix, suffix) = name
            .rsplit_once(".self_attn.")
            .map(|(p, s)| (p, format!("self_attn.{s}")))
            .or_else(|| {
                name.rsplit_once(".mlp.")
                    .map(|(p, s)| (p, format!("mlp.{s}")))
            })?;
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let ff = c.intermediate_size;
        let (fused, range, total) = match suffix.as_str() {
            "self_attn.q_proj.weight" => ("self_attn.qkv_proj.weight", 0..q, q + 2 * kv),
            "self_attn.k_proj.weight" => ("self_attn.qkv_proj.weight", q..q + kv, q + 2 * kv),
            "self_attn.v_proj.weight" => {
                ("self_attn.qkv_proj.weight", q + kv..q + 2 * kv, q + 2 * kv)
            }
            "mlp.gate_proj.weight" => ("mlp.gate_up_proj.weight", 0..ff, 2 * ff),
            "mlp.up_proj.weight" => ("mlp.gate_up_proj.weight", ff..2 * ff, 2 * ff),
            _ => return None,
        };
        Some((format!("{prefix}.{fused}"), range, total))
    }

    /// Where `name` is read from when the file has no tensor of that name.
    fn fused(&self, name: &str) -> Option<(String, Range<usize>, usize)> {
        if self.inner.contains(name) {
            return None;
        }
        self.part(name).filter(|(f, ..)| self.inner.contains(f))
    }
}

impl TensorSource for FusedProjections {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }

    fn matrix(&self, name: &str) -> Result<Matrix> {
        let Some((fused, rows, total)) = self.fused(name) else {
            return self.inner.matrix(name);
        };
        let matrix = self.fused_matrix(&fused)?;
        let (found_rows, cols) = matrix.dims()?;
        if found_rows != total {
            return Err(EngineError::ShapeMismatch {
                name: fused,
                expected: vec![total, cols],
                found: vec![found_rows, cols],
            });
        }
        matrix.select_rows(&[rows])
    }

    fn vector(&self, name: &str) -> Result<Tensor> {
        self.inner.vector(name)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name) || self.fused(name).is_some()
    }

    fn block_cols(&self, name: &str) -> Result<usize> {
        match self.fused(name) {
            Some((fused, ..)) => self.inner.block_cols(&fused),
            None => self.inner.block_cols(name),
        }
    }

    fn embedding(&self) -> Result<Embedding> {
        self.inner.embedding()
    }

    fn stored_size(&self, name: &str) -> Result<StoredSize> {
        match self.fused(name) {
            Some((fused, rows, total)) => {
                Ok(self.inner.stored_size(&fused)?.rows(rows.len(), total))
            }
            None => self.inner.stored_size(name),
        }
    }
}
