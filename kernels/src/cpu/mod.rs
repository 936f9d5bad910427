//! CPU kernels.

pub mod acts;
mod acts_k;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
mod avx2_q8;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k;
#[cfg(target_arch = "x86_64")]
mod avx512_q8;
pub mod isa;
pub mod layout;
pub(crate) mod layout_k;
pub(crate) mod layout_q8;
pub mod matmul;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;
