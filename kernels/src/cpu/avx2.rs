//! AVX2 + FMA kernels: per pair of blocks, byte products summed to eight 32-bit lanes
//! (even lanes the first block, odd lanes the second), scaled and accumulated in f32.

// Tiles index register arrays by row and token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, PAIR};

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

/// The two scales at `p` broadcast as (first, second, first, second, …).
///
/// # Safety
/// `p` and `p + 1` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scales2(p: *const f32) -> __m256 {
    // SAFETY: the caller guarantees two readable f32.
    _mm256_castsi256_ps(_mm256_set1_epi64x(unsafe {
        p.cast::<i64>().read_unaligned()
    }))
}

/// Σ offsets·sums of one Q4_1 row and one Q8_1 row, in block order.
fn offsets(m: &[f32], s: &[f32]) -> f32 {
    m.iter().zip(s).map(|(m, s)| m * s).sum()
}

/// Q4_1 rows `r0..r0+R` times Q8_1 rows `t0..t0+T`.
///
/// # Safety
/// AVX2 and FMA must be present; `r0 + R <= w.rows`, `t0 + T` within `a`, and `a` made
/// for `w`'s format and width.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn q4_1<const R: usize, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; R] {
    let pairs = w.pairs;
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for p in 0..pairs {
        let mut lo = [_mm256_setzero_si256(); R];
        let mut hi = [_mm256_setzero_si256(); R];
        let mut dx = [_mm256_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: row and pair are in bounds (caller), so are their 32 bytes and two
            // scales.
            unsafe {
                let packed =
                    _mm256_loadu_si256(w.qs.as_ptr().add(((r0 + r) * pairs + p) * 32).cast());
                lo[r] = _mm256_and_si256(packed, low);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low);
                dx[r] = scales2(w.d.as_ptr().add((r0 + r) * 2 * pairs + 2 * p));
            }
        }
        for t in 0..T {
            let base = ((t0 + t) * pairs + p) * PAIR;
            // SAFETY: as above, for the activation row.
            let (y0, y1, dy) = unsafe {
                (
                    _mm256_loadu_si256(a.qs.as_ptr().add(base).cast()),
                    _mm256_loadu_si256(a.qs.as_ptr().add(base + 32).cast()),
                    scales2(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                )
            };
            for r in 0..R {
                let pairs16 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo[r], y0),
                    _mm256_maddubs_epi16(hi[r], y1),
                );
                let dot = _mm256_madd_epi16(pairs16, ones);
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dx[r], dy), acc[r][t]);
            }
        }
    }
    let n = 2 * pairs;
    let mut out = [[0f32; T]; R];
    for (r, row) in out.iter_mut().enumerate() {
        for (t, v) in row.iter_mut().enumerate() {
            let (wm, am) = (&w.m[(r0 + r) * n..][..n], &a.s[(t0 + t) * n..][..n]);
            *v = hsum(acc[r][t]) + offsets(wm, am);
        }
    }
    out
}

/// Q8_0 rows `r0..r0+R` times Q8_0 rows `t0..t0+T`.
///
/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma")]
pub unsafe fn q8_0<const R: usize, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; R] {
    let pairs = w.pairs;
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for p in 0..pairs {
        let mut q = [[_mm256_setzero_si256(); 2]; R];
        let mut dx = [_mm256_setzero_ps(); R];
        for r in 0..R {
            let base = ((r0 + r) * pairs + p) * PAIR;
            // SAFETY: row and pair are in bounds (caller): 64 bytes and two scales.
            unsafe {
                for (h, qh) in q[r].iter_mut().enumerate() {
                    let stored = _mm256_loadu_si256(w.qs.as_ptr().add(base + 32 * h).cast());
                    *qh = _mm256_xor_si256(stored, flip);
                }
                dx[r] = scales2(w.d.as_ptr().add((r0 + r) * 2 * pairs + 2 * p));
            }
        }
        for t in 0..T {
            let base = ((t0 + t) * pairs + p) * PAIR;
            // SAFETY: as above, for the activation row.
            let (y, dy) = unsafe {
                (
                    [
                        _mm256_loadu_si256(a.qs.as_ptr().add(base).cast()),
                        _mm256_loadu_si256(a.qs.as_ptr().add(base + 32).cast()),
                    ],
                    scales2(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                )
            };
            for r in 0..R {
                // |w| · (y with w's sign): unsigned × signed bytes, exact.
                let mut dot = _mm256_setzero_si256();
                for (qh, yh) in q[r].iter().zip(&y) {
                    let ax = _mm256_sign_epi8(*qh, *qh);
                    let sy = _mm256_sign_epi8(*yh, *qh);
                    dot = _mm256_add_epi32(
                        dot,
                        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones),
                    );
                }
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dx[r], dy), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for (row, accs) in out.iter_mut().zip(&acc) {
        for (v, a) in row.iter_mut().zip(accs) {
            *v = hsum(*a);
        }
    }
    out
}
