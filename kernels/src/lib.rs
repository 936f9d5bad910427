//! Hot kernels. CPU SIMD kernels for quantized formats arrive with the performance work.
