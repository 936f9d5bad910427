//! One rank's slice of the paged KV cache on a GPU.
//!
//! Per layer, K and V are each one device tensor `[num_blocks, block_size, num_kv_heads,
//! head_dim]`: the row of one (slot, KV head) is contiguous, as `kernels/cuda/attention.cu`
//! reads it. The elements are the activation dtype (bf16), or one byte each for an 8-bit
//! cache (`tessera_kernels::kv_quant`), whose f32 scales sit beside the layer's blocks:
//! int8 one per (block, KV head), `[num_blocks, num_kv_heads]`, set by each write into the
//! block; fp8 one per KV head, `[num_kv_heads]`, set by the layer's first write (the
//! engine's warm-up step at load), as on CPU ranks. The scheduler owns block ids; every
//! rank holds the same blocks for its own KV heads.

use candle_core::{DType, Device, Tensor};
use tessera_kernels::gpu::launch::{check_head_dim, KvDtype};
use tessera_kernels::gpu::quantized::{holds, KvQuant};
use tessera_kernels::kv_quant::KvCacheDtype;

use crate::device::dtype::candle_dtype;
use crate::error::{EngineError, Result};

/// One layer's 8-bit scales.
#[derive(Debug)]
pub struct LayerScales {
    pub k: Tensor,
    pub v: Tensor,
    /// fp8: the layer's scales are set (its first write has run). Always true for int8,
    /// whose every write sets its blocks' scales.
    pub set: bool,
}

#[derive(Debug)]
pub struct CudaKvCache {
    pub(crate) k: Vec<Tensor>,
    pub(crate) v: Vec<Tensor>,
    /// Per layer, for an 8-bit cache; empty otherwise.
    pub(crate) scales: Vec<LayerScales>,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// The activation dtype the kernels read and write.
    pub dtype: KvDtype,
    /// What the cache stores: the activation dtype or an 8-bit type.
    pub stores: KvCacheDtype,
}

/// One layer of a cache, as the write and attention kernels take it.
#[derive(Debug, Clone, Copy)]
pub struct KvLayer<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    /// An 8-bit cache's type and scales (K's, V's).
    pub quant: Option<(KvQuant, &'a Tensor, &'a Tensor)>,
}

impl<'a> KvLayer<'a> {
    /// A layer of the activation dtype, without scales.
    pub fn plain(k: &'a Tensor, v: &'a Tensor) -> Self {
        KvLayer { k, v, quant: None }
    }
}

impl CudaKvCache {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        device: &Device,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
        stores: KvCacheDtype,
    ) -> Result<Self> {
        check_head_dim(head_dim).map_err(EngineError::Config)?;
        if block_size == 0 {
            return Err(EngineError::Config(
                "KV block size must be at least 1".into(),
            ));
        }
        if !holds(dtype, stores) {
            return Err(EngineError::Config(format!(
                "a {stores} KV cache on a CUDA rank that computes in {}: CUDA ranks hold \
                 {0}, fp8_e4m3 or int8",
                dtype.suffix()
            )));
        }
        let quant = KvQuant::of(stores);
        let elem = if quant.is_some() {
            DType::U8
        } else {
            candle_dtype(dtype)
        };
        let shape = (num_blocks, block_size, num_kv_heads, head_dim);
        let (mut k, mut v, mut scales) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..num_layers {
            k.push(Tensor::zeros(shape, elem, device)?);
            v.push(Tensor::zeros(shape, elem, device)?);
            if let Some(q) = quant {
                let n = q.scales_len(num_blocks, num_kv_heads);
                scales.push(LayerScales {
                    k: Tensor::zeros(n, DType::F32, device)?,
                    v: Tensor::zeros(n, DType::F32, device)?,
                    set: q == KvQuant::Int8,
                });
            }
        }
        Ok(Self {
            k,
            v,
            scales,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype,
            stores,
        })
    }

    pub fn num_layers(&self) -> usize {
        self.k.len()
    }

    /// Layer `i`, for the kernels; `None` past the last layer.
    pub fn layer(&self, i: usize) -> Option<KvLayer<'_>> {
        let (k, v) = (self.k.get(i)?, self.v.get(i)?);
        let quant = match KvQuant::of(self.stores) {
            Some(q) => {
                let s = self.scales.get(i)?;
                Some((q, &s.k, &s.v))
            }
            None => None,
        };
        Some(KvLayer { k, v, quant })
    }

    /// Whether layer `i`'s fp8 scales still wait for its first write (then the write
    /// sets them first).
    pub(crate) fn needs_scales(&self, i: usize) -> bool {
        self.scales.get(i).is_some_and(|s| !s.set)
    }

    /// Records that layer `i`'s scales are set.
    pub(crate) fn scales_set(&mut self, i: usize) {
        if let Some(s) = self.scales.get_mut(i) {
            s.set = true;
        }
    }
}
