//! CPU kernels.

pub mod blocks;
pub mod dot;
pub mod matmul;
pub mod quantize;
#[cfg(target_arch = "x86_64")]
mod x86;
