//! Small AVX2 helpers shared by the AVX2 and AVX-512 kernels (AVX-512F implies AVX2, FMA
//! and F16C, so the AVX-512 kernels inline them too).

use std::arch::x86_64::*;

/// Two f32 at `p` broadcast over eight lanes as (first, second, first, second, …).
///
/// # Safety
/// `p` and `p + 1` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pair_bcast256(p: *const f32) -> __m256 {
    // SAFETY: the caller guarantees two readable f32.
    _mm256_castsi256_ps(_mm256_set1_epi64x(unsafe {
        p.cast::<i64>().read_unaligned()
    }))
}

/// A group's eight f16 scales (row-major: row 0 block 0, row 0 block 1, …) as f32.
///
/// # Safety
/// `p` must point to 16 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn group_scales(p: *const u8) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: 16 bytes readable (caller); `out` holds 8 f32.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))) };
    out
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
