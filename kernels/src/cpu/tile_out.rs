//! Where a kernel tile writes its sums: straight into the matmul's output, one row of the
//! output per activation row of the tile, so no tile result is returned by value and
//! copied again.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::cpu::layout_wide::WIDE;

/// The output of one tile: activation row `t` of the tile at `ptr + t * stride`, of which
/// the first `live` of the group's sixteen rows exist (the rest are padding).
#[derive(Clone, Copy)]
pub(crate) struct TileOut {
    ptr: *mut f32,
    stride: usize,
    live: usize,
}

impl TileOut {
    /// # Safety
    /// For every activation row `t` of the tile, `ptr + t * stride .. + live` must be
    /// writable and written by no one else while the tile runs; `live <= 16`.
    pub(crate) unsafe fn new(ptr: *mut f32, stride: usize, live: usize) -> Self {
        Self {
            ptr,
            stride,
            live: live.min(WIDE),
        }
    }

    /// Row `t`'s sixteen sums, of which the live ones are written.
    ///
    /// # Safety
    /// `t` must be an activation row of the tile.
    pub(crate) unsafe fn put(self, t: usize, values: &[f32; WIDE]) {
        // SAFETY: the row's `live` values are writable (constructor's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), self.ptr.add(t * self.stride), self.live)
        }
    }

    /// [`TileOut::put`] from a 512-bit register (a masked store past the live rows).
    ///
    /// # Safety
    /// As for [`TileOut::put`]; AVX-512F must be present.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn put512(self, t: usize, sums: __m512) {
        let mask = (((1u32 << self.live) - 1) & 0xFFFF) as __mmask16;
        // SAFETY: as for `put`; masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(self.ptr.add(t * self.stride), mask, sums) }
    }

    /// [`TileOut::put`] for rows `8h..8h+8` of the group from a 256-bit register.
    ///
    /// # Safety
    /// As for [`TileOut::put`]; AVX must be present; `h` is 0 or 1.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx")]
    pub(crate) unsafe fn put256(self, t: usize, h: usize, sums: __m256) {
        let live = self.live.saturating_sub(8 * h).min(8);
        // SAFETY: as for `put`; only the live rows of this half are written.
        unsafe {
            let dst = self.ptr.add(t * self.stride + 8 * h);
            if live == 8 {
                _mm256_storeu_ps(dst, sums);
            } else if live > 0 {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), sums);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, live);
            }
        }
    }
}
