//! Embeddings: a chunk's final hidden states, after the model's final norm (what
//! transformers calls `last_hidden_state`), reduced on the host to what its pooling
//! needs. The residual stream is whole on every rank, so no collective is involved.

use candle_core::{DType, Device, Tensor};
use tessera_protocol::PoolingKind;

use super::shard::DecoderShard;
use crate::error::Result;
use crate::model::batch::{Batch, PoolSpan};
use crate::model::cpu_ops;

/// What one chunk of an embedding sequence contributes to its embedding.
#[derive(Debug, Clone, PartialEq)]
pub enum Pooled {
    /// The sum of the chunk's normed rows, over `rows` rows (mean pooling).
    Sum { sum: Vec<f32>, rows: usize },
    /// One normed row: the chunk's last (last pooling) or the prompt's first (CLS).
    Row(Vec<f32>),
    /// Nothing: a CLS chunk after the prompt's first token.
    Nothing,
}

impl DecoderShard {
    /// The pooled parts of `batch.pool`, in order, from the final hidden states `x`.
    pub fn pool(&self, x: &Tensor, batch: &Batch) -> Result<Vec<Pooled>> {
        if batch.pool.is_empty() {
            return Ok(Vec::new());
        }
        let eps = self.config.rms_norm_eps as f32;
        let norm = self.norm.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
        batch
            .pool
            .iter()
            .map(|span| self.pool_span(x, span, &norm, eps))
            .collect()
    }

    fn pool_span(&self, x: &Tensor, span: &PoolSpan, norm: &Tensor, eps: f32) -> Result<Pooled> {
        let last = span.token_start + span.num_tokens.max(1) - 1;
        let (start, n) = match span.kind {
            PoolingKind::Last => (last, 1),
            PoolingKind::Cls if span.start_pos == 0 => (span.token_start, 1),
            PoolingKind::Cls => return Ok(Pooled::Nothing),
            PoolingKind::Mean => (span.token_start, span.num_tokens),
        };
        let rows = x
            .narrow(0, start, n)?
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .contiguous()?;
        let normed = cpu_ops::rms_norm(&rows, norm, eps)?.to_vec2::<f32>()?;
        Ok(match span.kind {
            PoolingKind::Mean => {
                let mut sum = vec![0f32; normed.first().map_or(0, Vec::len)];
                for row in &normed {
                    for (s, v) in sum.iter_mut().zip(row) {
                        *s += v;
                    }
                }
                Pooled::Sum { sum, rows: n }
            }
            PoolingKind::Last | PoolingKind::Cls => {
                Pooled::Row(normed.into_iter().next().unwrap_or_default())
            }
        })
    }
}
