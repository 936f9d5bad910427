//! Hot kernels of Tessera.
//!
//! CPU: matrix products for GGML block-quantized weights, computed the way ggml computes
//! them (activations quantized to Q8_1 for Q4_1 weights, to Q8_0 for Q5_0 and Q8_0
//! weights and to Q8_K for the k-quants Q4_K and Q6_K,
//! rounded as ggml's x86 SIMD code rounds; an exact integer dot product per block, scaled
//! in f32), so results follow llama.cpp's arithmetic. Weights are repacked at load time
//! into the layout of [`cpu::layout`]. Each kernel has a scalar reference and
//! runtime-dispatched AVX2 and AVX-512 VNNI versions; tests compare them on random data.
//!
//! KV cache formats ([`kv_quant`]): the 16- and 8-bit element types of the paged KV cache
//! and their scales, shared by the CPU attention and the CUDA kernels' references.
//!
//! CUDA: paged attention, RoPE with the KV-cache write, and SiLU·up ([`gpu`]), compiled
//! to PTX by the build script under the `cuda` feature.

pub mod cpu;
pub mod gpu;
pub mod kv_quant;
pub mod memory;
mod round;

pub use cpu::isa::Isa;
pub use cpu::layout::{WeightFormat, QK, QK_K};
pub use cpu::matmul::QuantWeights;
