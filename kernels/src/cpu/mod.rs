//! CPU kernels.

pub mod acts;
mod acts_k;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
mod avx2_wide;
#[cfg(target_arch = "x86_64")]
mod avx512_k;
#[cfg(target_arch = "x86_64")]
mod avx512_wide;
pub mod isa;
pub mod layout;
pub(crate) mod layout_k;
pub(crate) mod layout_wide;
pub mod matmul;
mod packed;
pub mod scalar;
mod tile_out;
#[cfg(target_arch = "x86_64")]
mod x86;
