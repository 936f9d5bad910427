//! Small AVX2 helpers shared by the x86 kernels.

use std::arch::x86_64::*;

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
