//! Hot kernels of Tessera.
//!
//! CPU: matrix products for GGML block-quantized weights, computed the way ggml computes
//! them (activations quantized to Q8_1 for Q4_1 weights and to Q8_0 for Q8_0 weights,
//! rounded as ggml's x86 SIMD code rounds), so results follow llama.cpp's arithmetic.
//! Each kernel has a scalar reference and a runtime-dispatched AVX2 version; tests
//! compare them on random data.

pub mod cpu;

pub use cpu::blocks::{BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
pub use cpu::matmul::{QuantWeights, WeightFormat};
