//! One rank's slice of the paged KV cache.
//!
//! Per layer, K and V each live in one buffer laid out `[num_blocks, block_size,
//! num_kv_heads, head_dim]` — the layout a CUDA paged-attention kernel reads (one block
//! is contiguous, a token's heads are contiguous). The scheduler owns block ids; every
//! rank holds the same blocks for its own KV heads.

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
                tessera_kernels::memory::advise_huge_pages(&mut k);
                tessera_kernels::memory::advise_huge_pages(&mut v);
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

    /// Bytes per token per rank for a model shard (K and V, every layer, f32).
    pub fn bytes_per_token(num_layers: usize, num_kv_heads: usize, head_dim: usize) -> usize {
        2 * num_layers * num_kv_heads * head_dim * std::mem::size_of::<f32>()
    }

    /// Floats per slot (one token, all local KV heads).
    pub fn slot_stride(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}
