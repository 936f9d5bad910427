//! One rank's slice of the paged KV cache.
//!
//! Per layer, K and V each live in one buffer, one block after another. Values are laid
//! out `[num_blocks, block_size, num_kv_heads, head_dim]` (a token's heads contiguous);
//! keys `[num_blocks, num_kv_heads, head_dim, block_size]`, transposed within the block
//! like the key cache of paged-attention kernels, so one head dimension of a block's
//! positions is a contiguous row. The scheduler owns block ids; every rank holds the
//! same blocks for its own KV heads.

/// What one rank's KV cache holds per position, and where: the layers the rank runs, its
/// KV heads and their size, on its device in the CUDA ranks' layout or the host's.
#[derive(Debug, Clone)]
pub struct CacheShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The CUDA ranks' forward pass reads this cache (16-bit values, our kernels' layout).
    pub gpu_path: bool,
    pub device: candle_core::Device,
}

/// The KV cache of one rank, on its device.
#[derive(Debug)]
pub enum RankCache {
    Cpu(KvCache),
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    Cuda(crate::model::cuda::CudaKvCache),
}

impl RankCache {
    /// KV bytes per token of a rank's cache (K and V, every layer): f32 values on CPU,
    /// 16-bit ones on a GPU.
    pub fn bytes_per_token(on_gpu: bool, layers: usize, kv_heads: usize, head_dim: usize) -> usize {
        let value = if on_gpu {
            2
        } else {
            std::mem::size_of::<f32>()
        };
        2 * layers * kv_heads * head_dim * value
    }

    /// A cache of `num_blocks` blocks of `shape` on its device. A CUDA cache is zeroed on
    /// the calling thread's stream, which is synchronized before it returns: the worker
    /// that uses the cache may run on another thread, another stream.
    pub fn new(
        shape: &CacheShape,
        num_blocks: usize,
        block_size: usize,
    ) -> crate::error::Result<RankCache> {
        let (layers, kv_heads, head_dim) = (shape.layers, shape.kv_heads, shape.head_dim);
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        if shape.gpu_path {
            let cache = crate::model::cuda::CudaKvCache::new(
                &shape.device,
                layers,
                num_blocks,
                block_size,
                kv_heads,
                head_dim,
                crate::device::dtype::ACTIVATIONS,
            )?;
            shape.device.synchronize()?;
            return Ok(RankCache::Cuda(cache));
        }
        Ok(RankCache::Cpu(KvCache::new(
            layers, num_blocks, block_size, kv_heads, head_dim,
        )))
    }

    /// Bytes of one block of this cache.
    pub fn block_bytes(&self) -> usize {
        match self {
            RankCache::Cpu(c) => {
                Self::bytes_per_token(false, c.layers.len(), c.num_kv_heads, c.head_dim)
                    * c.block_size
            }
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            RankCache::Cuda(c) => {
                Self::bytes_per_token(true, c.k.len(), c.num_kv_heads, c.head_dim) * c.block_size
            }
        }
    }
}

/// K and V of one layer.
#[derive(Debug)]
pub struct LayerCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

#[derive(Debug)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let len = num_blocks * block_size * num_kv_heads * head_dim;
        let layers = (0..num_layers)
            .map(|_| {
                let (mut k, mut v) = (vec![0.0; len], vec![0.0; len]);
                for buf in [&mut k, &mut v] {
                    tessera_kernels::memory::advise_huge_pages(buf);
                    // Faulted in at load: first writes to fresh pages took 2-3% of a
                    // 16-client Gemma 3 benchmark's CPU time (write_kv).
                    tessera_kernels::memory::prefault(buf);
                }
                LayerCache { k, v }
            })
            .collect();
        Self {
            layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
        }
    }

    /// Index in a layer's key buffer of `(block, kv_head)`: `head_dim` rows of
    /// `block_size` keys follow.
    pub fn key_row(&self, block: usize, kv_head: usize) -> usize {
        (block * self.num_kv_heads + kv_head) * self.head_dim * self.block_size
    }

    /// Floats per slot (one token, all local KV heads).
    pub fn slot_stride(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}
