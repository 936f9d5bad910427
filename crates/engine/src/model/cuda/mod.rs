//! The pieces of a CUDA rank's forward pass that candle does not provide: device buffers
//! for our kernels, their launches, the paged KV cache on the GPU, the step's metadata on
//! the device, and f32-output matmuls.

pub(crate) mod buffers;
pub mod gemm;
pub mod kernels;
pub mod kv_cache;
pub mod step_meta;

pub use kv_cache::CudaKvCache;

/// The element type of a CUDA rank's matmul inputs and KV cache. The kernels take f16
/// as well; nothing chooses it yet.
pub const ACTIVATIONS: tessera_kernels::gpu::launch::KvDtype =
    tessera_kernels::gpu::launch::KvDtype::Bf16;
