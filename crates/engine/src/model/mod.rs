//! Models and the pieces of their forward pass.

pub mod batch;
pub mod cpu_ops;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub mod cuda;
pub mod fast_math;
pub(crate) mod head_norms;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod moe;
pub(crate) mod moe_routing;
pub mod paged_attention;
pub mod rope;
pub mod simd;
pub mod step_meta;

pub use batch::{Batch, BatchSeq, ChunkLimits};
pub use kv_cache::{KvCache, RankCache};
pub use llama::{load_rank_shards, load_shards, LlamaShard};

use candle_core::{DType, Device};

/// The dtype of dense weights and of the activations matmuls read on `device`: f32 on
/// CPU (our kernels and candle's fast CPU paths), bf16 on CUDA (cuBLAS tensor cores;
/// results accumulate in f32).
pub(crate) fn compute_dtype(device: &Device) -> DType {
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    if device.is_cuda() {
        return cuda::kernels::candle_dtype(cuda::ACTIVATIONS);
    }
    let _ = device;
    DType::F32
}
