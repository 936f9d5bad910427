//! AVX-512 VNNI kernels: one `vpdpbusd` per pair of blocks and row-activation pair sums
//! 64 byte products into sixteen 32-bit lanes (even lanes the first block, odd lanes the
//! second), which are scaled and accumulated in f32.
//!
//! Q8_0 weights are stored as `q + 128` (unsigned); each lane starts from the
//! activation's correction `-128 × Σy`, so the integer sum is exact.

// Tiles index register arrays by row and token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, PAIR};

/// The two scales at `p` broadcast as (first, second, first, second, …).
///
/// # Safety
/// `p` and `p + 1` must be readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scales2(p: *const f32) -> __m512 {
    // SAFETY: the caller guarantees two readable f32.
    _mm512_castsi512_ps(_mm512_set1_epi64(unsafe {
        p.cast::<i64>().read_unaligned()
    }))
}

/// Σ offsets·sums of one Q4_1 row and one Q8_1 row.
#[inline]
#[target_feature(enable = "avx512f")]
fn offsets(m: &[f32], s: &[f32]) -> f32 {
    let n = m.len().min(s.len());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n` values are in bounds of both slices.
        unsafe {
            acc = _mm512_fmadd_ps(
                _mm512_loadu_ps(m.as_ptr().add(i)),
                _mm512_loadu_ps(s.as_ptr().add(i)),
                acc,
            );
        }
        i += 16;
    }
    if i < n {
        let k = ((1u32 << (n - i)) - 1) as __mmask16;
        // SAFETY: the mask reads only the `n - i` values left.
        unsafe {
            acc = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(k, m.as_ptr().add(i)),
                _mm512_maskz_loadu_ps(k, s.as_ptr().add(i)),
                acc,
            );
        }
    }
    _mm512_reduce_add_ps(acc)
}

/// Q4_1 rows `r0..r0+R` times Q8_1 rows `t0..t0+T`.
///
/// # Safety
/// AVX-512 F/BW/VNNI must be present; `r0 + R <= w.rows`, `t0 + T` within `a`, and `a`
/// made for `w`'s format and width.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn q4_1<const R: usize, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; R] {
    let pairs = w.pairs;
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for p in 0..pairs {
        let mut x = [_mm512_setzero_si512(); R];
        let mut dx = [_mm512_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: row and pair are in bounds (caller), so are their 32 bytes and two
            // scales.
            unsafe {
                let packed =
                    _mm256_loadu_si256(w.qs.as_ptr().add(((r0 + r) * pairs + p) * 32).cast());
                // Low nibbles in the lower half, high nibbles in the upper half.
                let both = _mm512_broadcast_i64x4(packed);
                let shifted = _mm512_mask_srli_epi16::<4>(both, 0xFFFF_0000, both);
                x[r] = _mm512_and_si512(shifted, low);
                dx[r] = scales2(w.d.as_ptr().add((r0 + r) * 2 * pairs + 2 * p));
            }
        }
        for t in 0..T {
            // SAFETY: as above, for the activation row.
            let (y, dy) = unsafe {
                (
                    _mm512_loadu_si512(a.qs.as_ptr().add(((t0 + t) * pairs + p) * PAIR).cast()),
                    scales2(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                )
            };
            for r in 0..R {
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x[r], y);
                acc[r][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dx[r], dy), acc[r][t]);
            }
        }
    }
    let n = 2 * pairs;
    let mut out = [[0f32; T]; R];
    for (r, row) in out.iter_mut().enumerate() {
        for (t, v) in row.iter_mut().enumerate() {
            let (wm, am) = (&w.m[(r0 + r) * n..][..n], &a.s[(t0 + t) * n..][..n]);
            *v = _mm512_reduce_add_ps(acc[r][t]) + offsets(wm, am);
        }
    }
    out
}

/// Q8_0 rows `r0..r0+R` times Q8_0 rows `t0..t0+T`.
///
/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn q8_0<const R: usize, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; R] {
    let pairs = w.pairs;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for p in 0..pairs {
        let mut x = [_mm512_setzero_si512(); R];
        let mut dx = [_mm512_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: row and pair are in bounds (caller): 64 bytes and two scales.
            unsafe {
                x[r] = _mm512_loadu_si512(w.qs.as_ptr().add(((r0 + r) * pairs + p) * PAIR).cast());
                dx[r] = scales2(w.d.as_ptr().add((r0 + r) * 2 * pairs + 2 * p));
            }
        }
        for t in 0..T {
            let at = (t0 + t) * pairs + p;
            // SAFETY: as above, for the activation row and its 16 corrections.
            let (y, dy, corr) = unsafe {
                (
                    _mm512_loadu_si512(a.qs.as_ptr().add(at * PAIR).cast()),
                    scales2(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                    _mm512_loadu_si512(a.corr.as_ptr().add(at * 16).cast()),
                )
            };
            for r in 0..R {
                let dot = _mm512_dpbusd_epi32(corr, x[r], y);
                acc[r][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dx[r], dy), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for (row, accs) in out.iter_mut().zip(&acc) {
        for (v, a) in row.iter_mut().zip(accs) {
            *v = _mm512_reduce_add_ps(*a);
        }
    }
    out
}
