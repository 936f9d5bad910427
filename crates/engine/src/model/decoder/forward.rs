//! A step through one rank's decoder shard: the embedding, the layers on the rank's
//! CPU or CUDA half (chosen by its cache), and the LM head.

use candle_core::{DType, Tensor};

use super::shard::DecoderShard;
use crate::error::Result;
use crate::model::batch::Batch;
use crate::model::kv_cache::RankCache;
use crate::model::linear::Linear;
use crate::tp::Communicator;

impl DecoderShard {
    /// Token embeddings of the batch, `[tokens, hidden]`.
    pub fn embed(&self, batch: &Batch) -> Result<Tensor> {
        let ids = Tensor::from_slice(&batch.token_ids, batch.num_tokens(), &self.device)?;
        self.embed_ids(&ids)
    }

    /// Token embeddings of `ids` (u32 on the shard's device), `[tokens, hidden]`.
    pub(crate) fn embed_ids(&self, ids: &Tensor) -> Result<Tensor> {
        let x = Self::part(&self.embedding, "token embedding")?
            .forward(ids)?
            .to_dtype(DType::F32)?;
        Ok(match self.config.embed_scale {
            Some(scale) => (x * f64::from(scale))?,
            None => x,
        })
    }

    /// This shard's decoder layers over the hidden states `x`, with the rank's KV cache.
    pub fn layers(
        &self,
        x: Tensor,
        batch: &Batch,
        cache: &mut RankCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        match cache {
            RankCache::Cpu(cache) => self.layers_cpu(x, batch, cache, comm),
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            RankCache::Cuda(cache) => self.layers_cuda(x, batch, cache, comm),
        }
    }

    /// Final norm and LM head over the sampled rows of `x`: logits `[rows, vocab]`.
    pub fn head(&self, x: &Tensor, batch: &Batch, comm: &mut dyn Communicator) -> Result<Tensor> {
        let head = Self::part(&self.lm_head, "LM head")?;
        self.head_with(x, batch, (&self.norm, head), comm)
    }

    /// `norm`, then `head` (this rank's rows of the vocabulary, gathered), over the
    /// sampled rows of `x`: logits `[rows, vocab]`.
    pub(super) fn head_with(
        &self,
        x: &Tensor,
        batch: &Batch,
        head: (&Tensor, &Linear),
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        if batch.sample_rows.is_empty() {
            return Ok(Tensor::zeros(
                (0, self.config.vocab_size),
                DType::F32,
                &self.device,
            )?);
        }
        if self.runs_gpu_path() {
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            return self.head_cuda(x, batch, head, comm);
        }
        self.head_cpu(x, batch, head, comm)
    }
}
