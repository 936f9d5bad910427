//! A model served with a shorter context than its file states (`--max-model-len`).

use candle_core::Tensor;

use crate::error::Result;
use crate::loader::matrix::Matrix;
use crate::loader::source::{Embedding, StoredSize, TensorSource};
use crate::spec::model::ModelConfig;

/// `inner`'s weights, with its config's context limited.
pub(crate) struct ContextLimit {
    inner: Box<dyn TensorSource>,
    config: ModelConfig,
}

impl ContextLimit {
    /// `inner` served with at most `max_len` positions; refused beyond the model's own.
    pub(crate) fn new(inner: Box<dyn TensorSource>, max_len: usize) -> Result<Self> {
        let mut config = inner.config().clone();
        config.limit_context(max_len)?;
        Ok(Self { inner, config })
    }
}

impl TensorSource for ContextLimit {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn matrix(&self, name: &str) -> Result<Matrix> {
        self.inner.matrix(name)
    }

    fn vector(&self, name: &str) -> Result<Tensor> {
        self.inner.vector(name)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn block_cols(&self, name: &str) -> Result<usize> {
        self.inner.block_cols(name)
    }

    fn embedding(&self) -> Result<Embedding> {
        self.inner.embedding()
    }

    fn stored_size(&self, name: &str) -> Result<StoredSize> {
        self.inner.stored_size(name)
    }
}
