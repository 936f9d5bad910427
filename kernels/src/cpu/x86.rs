//! Small helpers shared by the x86 kernels: unpacking a quad's nibbles (the 32-value
//! formats and the k-quants store them alike, [`crate::cpu::layout_wide::nibble_at`]),
//! broadcasting an activation quad, and spreading bits to bytes.

use std::arch::x86_64::*;

use crate::cpu::layout_wide::QUAD;

/// The low four bits of quad `i`'s 64 values, value `v` in byte `v`: low nibbles in the
/// lower half (values 0..32), high nibbles in the upper half.
///
/// # Safety
/// `chunk` must point to a chunk holding quad `i`'s 32 bytes of nibbles at
/// `i * 32`; AVX-512 F/BW must be present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn nibbles512(chunk: *const u8, i: usize) -> __m512i {
    // SAFETY: the quad's 32 bytes are readable (caller).
    let packed = unsafe { _mm256_loadu_si256(chunk.add(i * QUAD / 2).cast()) };
    let both = _mm512_broadcast_i64x4(packed);
    let shifted = _mm512_mask_srli_epi16::<4>(both, 0xFFFF_0000, both);
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F))
}

/// The low four bits of values `32h..32h+32` of quad `i` (rows `8h..8h+8`), value `v` of
/// those in byte `v`.
///
/// # Safety
/// As for [`nibbles512`], with AVX2 present; `h` is 0 or 1.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn nibbles256(chunk: *const u8, i: usize, h: usize) -> __m256i {
    // SAFETY: the quad's 32 bytes are readable (caller).
    let packed = unsafe { _mm256_loadu_si256(chunk.add(i * QUAD / 2).cast()) };
    let shifted = if h == 0 {
        packed
    } else {
        _mm256_srli_epi16::<4>(packed)
    };
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
}

/// The four activation quants at `p` as one 32-bit value, to broadcast.
///
/// # Safety
/// `p` must point to 4 readable bytes.
#[inline]
pub(crate) unsafe fn quad_of(p: *const i8) -> i32 {
    // SAFETY: 4 bytes readable (caller).
    unsafe { p.cast::<i32>().read_unaligned() }
}

/// The 32 bits of `bits` as 32 bytes, `0xFF` where the bit is set (byte `i` from bit `i`).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn bytes_from_bits(bits: u32) -> __m256i {
    // Byte i takes source byte i / 8, then keeps only bit i % 8 clear in the mask below;
    // the byte is all ones exactly when that bit was set.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let others = _mm256_set1_epi64x(0x7FBF_DFEF_F7FB_FDFEu64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}
