//! One rank's slice of the paged KV cache on a GPU.
//!
//! Per layer, K and V are each one device tensor `[num_blocks, block_size, num_kv_heads,
//! head_dim]` of the activation dtype (f16 or bf16): the row of one (slot, KV head) is
//! contiguous, as `kernels/cuda/attention.cu` reads it. The scheduler owns block ids;
//! every rank holds the same blocks for its own KV heads.

use candle_core::{Device, Tensor};
use tessera_kernels::gpu::launch::{check_head_dim, KvDtype};

use crate::device::dtype::candle_dtype;
use crate::error::{EngineError, Result};

#[derive(Debug)]
pub struct CudaKvCache {
    pub(crate) k: Vec<Tensor>,
    pub(crate) v: Vec<Tensor>,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub dtype: KvDtype,
}

impl CudaKvCache {
    pub fn new(
        device: &Device,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Result<Self> {
        check_head_dim(head_dim).map_err(EngineError::Config)?;
        if block_size == 0 {
            return Err(EngineError::Config(
                "KV block size must be at least 1".into(),
            ));
        }
        let shape = (num_blocks, block_size, num_kv_heads, head_dim);
        let mut k = Vec::with_capacity(num_layers);
        let mut v = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            k.push(Tensor::zeros(shape, candle_dtype(dtype), device)?);
            v.push(Tensor::zeros(shape, candle_dtype(dtype), device)?);
        }
        Ok(Self {
            k,
            v,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype,
        })
    }
}
