//! AVX2 + FMA dot products, accumulated like ggml's: per block an exact integer dot
//! product, scaled and summed in an 8-lane f32 accumulator.

use std::arch::x86_64::*;

use crate::cpu::blocks::{BlockQ4_1, BlockQ8_0, BlockQ8_1};

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Unsigned × signed bytes, summed to 8 i32 lanes, as f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn mul_sum_us8(ux: __m256i, sy: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(ux, sy);
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    _mm256_cvtepi32_ps(quads)
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q4_1_q8_1_avx2(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let mask = _mm_set1_epi8(0x0F);
    for (bx, by) in x.iter().zip(y) {
        // SAFETY: `qs` are 16 and 32 bytes; unaligned loads of exactly that size.
        let (packed, qy) = unsafe {
            (
                _mm_loadu_si128(bx.qs.as_ptr().cast()),
                _mm256_loadu_si256(by.qs.as_ptr().cast()),
            )
        };
        let lo = _mm_and_si128(packed, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), mask);
        let qx = _mm256_set_m128i(hi, lo);
        let xy = mul_sum_us8(qx, qy);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(bx.d * by.d), xy, acc);
        summs += bx.m * by.s;
    }
    hsum(acc) + summs
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_q8_0_q8_0_avx2(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        // SAFETY: `qs` are 32 bytes; unaligned loads of exactly that size.
        let (qx, qy) = unsafe {
            (
                _mm256_loadu_si256(bx.qs.as_ptr().cast()),
                _mm256_loadu_si256(by.qs.as_ptr().cast()),
            )
        };
        // |x| · (y with x's sign): unsigned × signed bytes, exact.
        let ax = _mm256_sign_epi8(qx, qx);
        let sy = _mm256_sign_epi8(qy, qx);
        let xy = mul_sum_us8(ax, sy);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(bx.d * by.d), xy, acc);
    }
    hsum(acc)
}

/// Four Q4_1 rows against one Q8_1 activation row. Each row is accumulated exactly as
/// [`dot_q4_1_q8_1_avx2`] does (same order, same rounding), so results are identical;
/// the four independent chains hide the FMA latency and share the activation loads.
///
/// # Safety
/// The CPU must support AVX2 and FMA; the four rows must be as long as `y`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot4_q4_1_q8_1_avx2(x: [&[BlockQ4_1]; 4], y: &[BlockQ8_1]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0f32; 4];
    let mask = _mm_set1_epi8(0x0F);
    for (b, by) in y.iter().enumerate() {
        // SAFETY: `qs` is 32 bytes; an unaligned load of exactly that size.
        let qy = unsafe { _mm256_loadu_si256(by.qs.as_ptr().cast()) };
        for r in 0..4 {
            let bx = &x[r][b];
            // SAFETY: `qs` is 16 bytes; an unaligned load of exactly that size.
            let packed = unsafe { _mm_loadu_si128(bx.qs.as_ptr().cast()) };
            let lo = _mm_and_si128(packed, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), mask);
            let xy = mul_sum_us8(_mm256_set_m128i(hi, lo), qy);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(bx.d * by.d), xy, acc[r]);
            summs[r] += bx.m * by.s;
        }
    }
    std::array::from_fn(|r| hsum(acc[r]) + summs[r])
}

/// Four Q8_0 rows against one Q8_0 activation row, each accumulated exactly as
/// [`dot_q8_0_q8_0_avx2`] does.
///
/// # Safety
/// The CPU must support AVX2 and FMA; the four rows must be as long as `y`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot4_q8_0_q8_0_avx2(x: [&[BlockQ8_0]; 4], y: &[BlockQ8_0]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for (b, by) in y.iter().enumerate() {
        // SAFETY: `qs` is 32 bytes; an unaligned load of exactly that size.
        let qy = unsafe { _mm256_loadu_si256(by.qs.as_ptr().cast()) };
        for r in 0..4 {
            let bx = &x[r][b];
            // SAFETY: as above.
            let qx = unsafe { _mm256_loadu_si256(bx.qs.as_ptr().cast()) };
            let xy = mul_sum_us8(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(bx.d * by.d), xy, acc[r]);
        }
    }
    std::array::from_fn(|r| hsum(acc[r]))
}
