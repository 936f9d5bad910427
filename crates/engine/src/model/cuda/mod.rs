//! The pieces of a CUDA rank's forward pass that candle does not provide: device buffers
//! for our kernels, their launches, the paged KV cache on the GPU, the step's metadata on
//! the device, and f32-output matmuls. In test builds (`gpu-emulation`) host ranks run
//! the same path with the kernels emulated.

#[cfg(feature = "cuda")]
pub mod gemm;
pub mod graph_plan;
pub mod graphs;
pub mod kernels;
pub mod kv_cache;
pub mod kv_store;
pub mod quant_matvec;
pub mod reductions;
pub mod step_meta;

pub use kv_cache::{CudaKvCache, KvLayer};

use candle_core::Tensor;

use crate::device::buffers::Gpu;
use crate::device::dtype::{candle_dtype, ACTIVATIONS};
use crate::error::Result;
use crate::model::linear::{ColumnParallel, Linear};
use crate::spec::model::Activation;
use crate::spec::moe::ClampedSwiglu;

/// How a gated MLP on a CUDA rank combines its gate and up halves.
#[derive(Debug, Clone, Copy)]
pub enum MlpGate {
    /// `activation(gate) · up`: SiLU, or GELU's tanh approximation.
    Plain(Activation),
    /// gpt-oss's experts' gate, both halves clamped first.
    Clamped(ClampedSwiglu),
}

impl From<Activation> for MlpGate {
    fn from(a: Activation) -> Self {
        MlpGate::Plain(a)
    }
}

/// A gated MLP (a dense one, or one expert of a mixture) on the rows `h` (`[rows,
/// hidden]`, matmul input type): the fused gate/up matmul, the gate (`activation(gate) ·
/// up`, or gpt-oss's clamped one) in one kernel, and the down matmul's f32 partial sum
/// `[rows, hidden]`.
pub(crate) fn gated_mlp(
    gate_up: &ColumnParallel,
    down: &Linear,
    h: &Tensor,
    gate: MlpGate,
) -> Result<Tensor> {
    let gpu = Gpu::of(h.device())?;
    let fused = gate_up
        .forward_fused(h)?
        .to_dtype(candle_dtype(ACTIVATIONS))?
        .contiguous()?;
    let width = gate_up.widths().first().copied().unwrap_or(0);
    let a = kernels::gated_mul(gpu, ACTIVATIONS, &fused, width, gate)?;
    down.forward_f32(&a)
}
