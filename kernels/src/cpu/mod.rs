//! CPU kernels.

pub mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod isa;
pub mod layout;
pub mod matmul;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;
