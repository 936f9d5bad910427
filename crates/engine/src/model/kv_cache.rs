//! One rank's slice of the paged KV cache.
//!
//! Per layer, K and V each live in one buffer, one block after another. Values are laid
//! out `[num_blocks, block_size, num_kv_heads, head_dim]` (a token's heads contiguous);
//! keys `[num_blocks, num_kv_heads, head_dim, block_size]`, transposed within the block
//! like the key cache of paged-attention kernels, so one head dimension of a block's
//! positions is a contiguous row. The scheduler owns block ids; every rank holds the
//! same blocks for its own KV heads.
//!
//! The elements are of the cache's [`KvCacheDtype`] (`tessera_kernels::kv_quant` says how
//! each stores a value), with their scales beside them: fp8 one per KV head of each layer
//! for K and for V, int8 one per block and KV head.

use half::{bf16, f16};
use tessera_kernels::kv_quant::{E4m3, KvElement, ScaleKind};
use tessera_kernels::memory::{zeroed_vec, ZeroBits};

pub use tessera_kernels::kv_quant::KvCacheDtype;

/// What one rank's KV cache holds per position, and where: the layers the rank runs, its
/// KV heads and their size, its element type, on its device in the CUDA ranks' layout or
/// the host's.
#[derive(Debug, Clone)]
pub struct CacheShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The CUDA ranks' forward pass reads this cache (our kernels' layout).
    pub gpu_path: bool,
    pub device: candle_core::Device,
    pub dtype: KvCacheDtype,
}

/// The KV cache of one rank, on its device.
#[derive(Debug)]
pub enum RankCache {
    Cpu(KvCache),
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    Cuda(crate::model::cuda::CudaKvCache),
}

impl RankCache {
    /// KV bytes of one block of `block_size` positions of a rank's cache: K and V of
    /// every layer and KV head, with int8's scales.
    pub fn block_bytes_of(
        dtype: KvCacheDtype,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> usize {
        layers * kv_heads * dtype.block_bytes_per_head(block_size, head_dim)
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
                shape.dtype,
            )?;
            shape.device.synchronize()?;
            return Ok(RankCache::Cuda(cache));
        }
        Ok(RankCache::Cpu(KvCache::new(
            shape.dtype,
            layers,
            num_blocks,
            block_size,
            kv_heads,
            head_dim,
        )?))
    }

    /// What this cache stores.
    pub fn dtype(&self) -> KvCacheDtype {
        match self {
            RankCache::Cpu(c) => c.dtype,
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            RankCache::Cuda(c) => c.stores,
        }
    }

    /// Bytes of one block of this cache.
    pub fn block_bytes(&self) -> usize {
        match self {
            RankCache::Cpu(c) => Self::block_bytes_of(
                c.dtype,
                c.layers.len(),
                c.num_kv_heads,
                c.head_dim,
                c.block_size,
            ),
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            RankCache::Cuda(c) => Self::block_bytes_of(
                c.stores,
                c.k.len(),
                c.num_kv_heads,
                c.head_dim,
                c.block_size,
            ),
        }
    }
}

/// K and V of one layer, stored as `T`, with their scales: fp8 one per KV head (0 until
/// the layer's first write sets it), int8 one per (block, KV head) (set by each write
/// into the block), none otherwise.
#[derive(Debug)]
pub struct TypedLayer<T> {
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub k_scales: Vec<f32>,
    pub v_scales: Vec<f32>,
}

impl<T: KvElement + ZeroBits> TypedLayer<T> {
    /// A layer of `len` zeros for K and for V, in memory the kernel maps as it is first
    /// written: a cache sized to the machine costs neither resident memory nor load time
    /// until sequences write into its blocks (on first write, a page is zeroed where it
    /// is needed). `None` when the host refuses the memory.
    fn new(len: usize, blocks: usize, kv_heads: usize) -> Option<Self> {
        let scales = match T::DTYPE.scales() {
            ScaleKind::None => 0,
            ScaleKind::PerHead => kv_heads,
            ScaleKind::PerBlockHead => blocks * kv_heads,
        };
        let (mut k, mut v) = (zeroed_vec::<T>(len)?, zeroed_vec::<T>(len)?);
        for buf in [&mut k, &mut v] {
            tessera_kernels::memory::advise_huge_pages(buf);
        }
        Some(TypedLayer {
            k,
            v,
            k_scales: zeroed_vec(scales)?,
            v_scales: zeroed_vec(scales)?,
        })
    }
}

impl<T: KvElement> TypedLayer<T> {
    /// The index of the scale of `(block, kv_head)` among `nkv` heads, for the cache
    /// types that have scales.
    #[inline(always)]
    pub fn scale_index(block: usize, kv_head: usize, nkv: usize) -> Option<usize> {
        match T::DTYPE.scales() {
            ScaleKind::None => None,
            ScaleKind::PerHead => Some(kv_head),
            ScaleKind::PerBlockHead => Some(block * nkv + kv_head),
        }
    }

    /// The scale keys of `(block, kv_head)` are stored under (1 without scales).
    #[inline(always)]
    pub fn k_scale(&self, block: usize, kv_head: usize, nkv: usize) -> f32 {
        Self::scale_index(block, kv_head, nkv).map_or(1.0, |i| self.k_scales[i])
    }

    /// The scale values of `(block, kv_head)` are stored under (1 without scales).
    #[inline(always)]
    pub fn v_scale(&self, block: usize, kv_head: usize, nkv: usize) -> f32 {
        Self::scale_index(block, kv_head, nkv).map_or(1.0, |i| self.v_scales[i])
    }
}

/// One layer's cache, of the cache's element type.
#[derive(Debug)]
pub enum LayerCache {
    F32(TypedLayer<f32>),
    Bf16(TypedLayer<bf16>),
    F16(TypedLayer<f16>),
    Fp8(TypedLayer<E4m3>),
    Int8(TypedLayer<i8>),
}

/// Runs `$body` with `$layer` bound to the typed layer inside a [`LayerCache`].
macro_rules! with_layer {
    ($cache:expr, $layer:ident => $body:expr) => {
        match $cache {
            $crate::model::kv_cache::LayerCache::F32($layer) => $body,
            $crate::model::kv_cache::LayerCache::Bf16($layer) => $body,
            $crate::model::kv_cache::LayerCache::F16($layer) => $body,
            $crate::model::kv_cache::LayerCache::Fp8($layer) => $body,
            $crate::model::kv_cache::LayerCache::Int8($layer) => $body,
        }
    };
}
pub(crate) use with_layer;

impl LayerCache {
    fn new(dtype: KvCacheDtype, len: usize, blocks: usize, kv_heads: usize) -> Option<Self> {
        Some(match dtype {
            KvCacheDtype::F32 => LayerCache::F32(TypedLayer::new(len, blocks, kv_heads)?),
            KvCacheDtype::Bf16 => LayerCache::Bf16(TypedLayer::new(len, blocks, kv_heads)?),
            KvCacheDtype::F16 => LayerCache::F16(TypedLayer::new(len, blocks, kv_heads)?),
            KvCacheDtype::Fp8E4m3 => LayerCache::Fp8(TypedLayer::new(len, blocks, kv_heads)?),
            KvCacheDtype::Int8 => LayerCache::Int8(TypedLayer::new(len, blocks, kv_heads)?),
        })
    }

    /// fp8: the per-head scales of K and V, once the first write has set them.
    pub fn fp8_scales(&self) -> Option<(&[f32], &[f32])> {
        match self {
            LayerCache::Fp8(l) if l.k_scales.iter().all(|s| *s > 0.0) => {
                Some((&l.k_scales, &l.v_scales))
            }
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct KvCache {
    pub layers: Vec<LayerCache>,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub dtype: KvCacheDtype,
}

impl KvCache {
    /// A cache of `num_blocks` blocks for `num_layers` layers, all zero, none of it
    /// resident until written (see [`TypedLayer`]'s allocation). An error when the host
    /// cannot give the memory.
    pub fn new(
        dtype: KvCacheDtype,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> crate::error::Result<Self> {
        // Too many to address saturates, and is refused below like too many to hold.
        let len = num_blocks.saturating_mul(block_size * num_kv_heads * head_dim);
        let layers = (0..num_layers)
            .map(|_| LayerCache::new(dtype, len, num_blocks, num_kv_heads))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                crate::error::EngineError::Config(format!(
                    "the host cannot allocate a KV cache of {num_blocks} blocks ({} MiB per \
                     layer); give a smaller --kv-cache-memory-mib or \
                     --cpu-kv-cache-utilization",
                    (len.saturating_mul(2 * dtype.bytes())) >> 20
                ))
            })?;
        Ok(Self {
            layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype,
        })
    }

    /// A cache with no layers and no blocks, holding nothing (a rank's cache between
    /// dropping one and allocating the next).
    pub fn empty(dtype: KvCacheDtype, block_size: usize) -> Self {
        Self {
            layers: Vec::new(),
            num_blocks: 0,
            block_size,
            num_kv_heads: 0,
            head_dim: 0,
            dtype,
        }
    }

    /// Index in a layer's key buffer of `(block, kv_head)`: `head_dim` rows of
    /// `block_size` keys follow.
    pub fn key_row(&self, block: usize, kv_head: usize) -> usize {
        (block * self.num_kv_heads + kv_head) * self.head_dim * self.block_size
    }

    /// Values per slot (one token, all local KV heads).
    pub fn slot_stride(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The key and value `layer` (one of this cache's layers, taken out of it) holds for
    /// `slot` and `kv_head`, decoded with their scales.
    pub fn read(&self, layer: &LayerCache, slot: usize, kv_head: usize) -> (Vec<f32>, Vec<f32>) {
        let (bs, hd, nkv) = (self.block_size, self.head_dim, self.num_kv_heads);
        let (block, i) = (slot / bs, slot % bs);
        with_layer!(layer, l => {
            let (ks, vs) = (l.k_scale(block, kv_head, nkv), l.v_scale(block, kv_head, nkv));
            let base = self.key_row(block, kv_head);
            let k = (0..hd).map(|d| l.k[base + d * bs + i].decode() * ks).collect();
            let o = slot * self.slot_stride() + kv_head * hd;
            let v = l.v[o..o + hd].iter().map(|x| x.decode() * vs).collect();
            (k, v)
        })
    }
}
