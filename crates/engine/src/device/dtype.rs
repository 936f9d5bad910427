//! The element types a rank computes in: dense weights and matmul inputs in f32 on CPU
//! ranks, in bf16 on CUDA ranks (whose KV cache holds the same type). Below the loader and
//! the model, which both place tensors on a device in its type.

use candle_core::{DType, Device};
use tessera_kernels::gpu::launch::KvDtype;

/// The element type of a CUDA rank's matmul inputs and KV cache. The kernels take f16
/// as well; nothing chooses it yet.
pub const ACTIVATIONS: KvDtype = KvDtype::Bf16;

/// The candle dtype of a KV element type.
pub fn candle_dtype(d: KvDtype) -> DType {
    match d {
        KvDtype::Bf16 => DType::BF16,
        KvDtype::F16 => DType::F16,
    }
}

/// The dtype of dense weights and of the activations matmuls read on `device`: f32 on
/// CPU (our kernels and candle's fast CPU paths), bf16 on CUDA (cuBLAS tensor cores;
/// results accumulate in f32).
pub fn compute_dtype(device: &Device) -> DType {
    if device.is_cuda() {
        return candle_dtype(ACTIVATIONS);
    }
    DType::F32
}
