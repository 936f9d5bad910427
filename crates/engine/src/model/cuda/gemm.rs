//! Matrix products with 16-bit inputs and f32 results (cuBLAS `GemmEx`, f32 compute).
//!
//! candle's CUDA matmul returns its inputs' dtype, so a bf16 product is rounded to bf16.
//! The row-parallel layers (o_proj, down) and the LM head use this instead: their
//! results are partial sums that an all-reduce adds up, and logits that the sampler
//! reads, so they stay in f32 and the residual stream is rounded only where a matmul
//! reads it. Tensor parallelism then changes only the order of f32 additions, as on CPU.

use std::ffi::c_void;

use candle_core::cuda::cudarc::cublas::{result::gemm_ex, sys as cublas_sys};
use candle_core::{CudaDevice, DType, Tensor};

use crate::device::buffers::{Gpu, Held};
use crate::error::{EngineError, Result};

/// `x · wᵀ` for `x` `[m, k]` and `w` `[n, k]` (both bf16 or both f16, contiguous):
/// `[m, n]` in f32.
pub fn matmul_f32_out(dev: &CudaDevice, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let (n, k2) = w.dims2()?;
    if k != k2 || x.dtype() != w.dtype() {
        return Err(EngineError::Step(format!(
            "gemm: x is [{m}, {k}] {:?}, w is [{n}, {k2}] {:?}",
            x.dtype(),
            w.dtype()
        )));
    }
    let data_type = match x.dtype() {
        DType::BF16 => cublas_sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => cublas_sys::cudaDataType::CUDA_R_16F,
        other => {
            return Err(EngineError::Step(format!(
                "gemm: 16-bit inputs expected, found {other:?}"
            )))
        }
    };
    let dims = |v: usize| {
        i32::try_from(v).map_err(|_| EngineError::Step(format!("gemm dimension {v} too large")))
    };
    let (mi, ni, ki) = (dims(m)?, dims(n)?, dims(k)?);
    // With beta = 0 cuBLAS writes every element of the output without reading it.
    let out = Gpu::of(x.device())?.output(DType::F32, (m, n))?;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    let blas = dev.cublas_handle();
    let (xh, wh) = (Held::new(x, "gemm x")?, Held::new(w, "gemm w")?);
    let (alpha, beta) = (1f32, 0f32);
    let oh = Held::new(&out, "gemm out")?;
    let (xp, wp, op) = (xh.address()?, wh.address()?, oh.address()?);
    // Row-major `out[m, n] = x[m, k] · w[n, k]ᵀ` is column-major `outᵀ[n, m] = w · xᵀ`:
    // A = w read transposed (lda k), B = x (ldb k).
    // SAFETY: the pointers cover m·k, n·k and m·n elements of the stated types, and the
    // handle launches on this device's stream, where they are valid.
    unsafe {
        gemm_ex(
            *blas.handle(),
            cublas_sys::cublasOperation_t::CUBLAS_OP_T,
            cublas_sys::cublasOperation_t::CUBLAS_OP_N,
            ni,
            mi,
            ki,
            (&alpha as *const f32).cast::<c_void>(),
            wp as *const c_void,
            data_type,
            ki,
            xp as *const c_void,
            data_type,
            ki,
            (&beta as *const f32).cast::<c_void>(),
            op as *mut c_void,
            cublas_sys::cudaDataType::CUDA_R_32F,
            ni,
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| EngineError::Step(format!("cuBLAS GemmEx: {e:?}")))?;
    drop((xh, wh, oh));
    Ok(out)
}
