//! AVX-512 VNNI kernels over one group of four weight rows: one `vpdpbusd` per pair of
//! blocks and (row, activation) sums 64 byte products into sixteen 32-bit lanes (even
//! lanes the first block, odd lanes the second), which are scaled and accumulated in f32.
//!
//! Q5_0 weights are stored as `q + 16` (unsigned); each lane starts from the activation's
//! correction `-16 × Σy`, so the integer sum is exact. Q8_0 has its own layout and kernel
//! ([`crate::cpu::avx512_q8`]).

// Tiles index register arrays by row and token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, WeightFormat, GROUP, PAIR};
use crate::cpu::x86::{group_scales, pair_bcast256};

/// Two f32 at `p` broadcast as (first, second, first, second, …).
///
/// # Safety
/// `p` and `p + 1` must be readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_bcast(p: *const f32) -> __m512 {
    // SAFETY: the caller guarantees two readable f32.
    _mm512_castsi512_ps(_mm512_set1_epi64(unsafe {
        p.cast::<i64>().read_unaligned()
    }))
}

/// Q4_1 rows `r0..r0+4` (one group) times Q8_1 rows `t0..t0+T`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be present; `r0` a multiple of [`GROUP`] below the
/// padded rows, `t0 + T` within `a`, and `a` made for `w`'s format and width.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn q4_1<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let pairs = w.pairs;
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); T]; GROUP];
    // Offset terms m·s of the four rows, per token: lanes (2r, 2r+1) hold row r's two
    // blocks of each pair.
    let mut offs = [_mm256_setzero_ps(); T];
    for p in 0..pairs {
        let chunk = w.chunk(r0, p).as_ptr();
        // SAFETY: a Q4_1 chunk ends with its eight f16 offsets.
        let m = unsafe {
            _mm256_cvtph_ps(_mm_loadu_si128(
                chunk
                    .add(PackedWeights::offsets_at(WeightFormat::Q4_1))
                    .cast(),
            ))
        };
        let mut x = [_mm512_setzero_si512(); GROUP];
        let mut dx = [_mm512_setzero_ps(); GROUP];
        // SAFETY: a chunk holds 4 × 32 quant bytes, then 16 bytes of scales.
        let scales = unsafe { group_scales(chunk.add(GROUP * 32)) };
        for r in 0..GROUP {
            // SAFETY: as above.
            unsafe {
                let packed = _mm256_loadu_si256(chunk.add(r * 32).cast());
                // Low nibbles in the lower half, high nibbles in the upper half.
                let both = _mm512_broadcast_i64x4(packed);
                let shifted = _mm512_mask_srli_epi16::<4>(both, 0xFFFF_0000, both);
                x[r] = _mm512_and_si512(shifted, low);
                dx[r] = pair_bcast(scales.as_ptr().add(2 * r));
            }
        }
        for t in 0..T {
            // SAFETY: activation row `t0 + t` and pair `p` are in bounds (caller).
            let (y, dy) = unsafe {
                (
                    _mm512_loadu_si512(a.qs.as_ptr().add(((t0 + t) * pairs + p) * PAIR).cast()),
                    pair_bcast(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                )
            };
            // SAFETY: the activation's Q8_1 sums of pair `p` are in bounds (caller).
            let s = unsafe { pair_bcast256(a.s.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)) };
            offs[t] = _mm256_fmadd_ps(m, s, offs[t]);
            for r in 0..GROUP {
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), x[r], y);
                acc[r][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dx[r], dy), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; GROUP];
    for (t, o) in offs.iter().enumerate() {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *o) };
        for (r, row) in out.iter_mut().enumerate() {
            row[t] = _mm512_reduce_add_ps(acc[r][t]) + (lanes[2 * r] + lanes[2 * r + 1]);
        }
    }
    out
}

/// Q5_0 rows `r0..r0+4` (one group) times Q8_0 rows `t0..t0+T`: the four low bits as in
/// [`q4_1`], the fifth set from a 64-bit mask, `q + 16` multiplied unsigned and each lane
/// started from the activation's correction `-16 × Σy`.
///
/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn q5_0<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let pairs = w.pairs;
    let low = _mm512_set1_epi8(0x0F);
    let fifth = _mm512_set1_epi8(0x10);
    let mut acc = [[_mm512_setzero_ps(); T]; GROUP];
    for p in 0..pairs {
        let chunk = w.chunk(r0, p).as_ptr();
        let mut x = [_mm512_setzero_si512(); GROUP];
        let mut dx = [_mm512_setzero_ps(); GROUP];
        // SAFETY: a Q5_0 chunk holds 4 × 32 quant bytes, 4 × 8 bytes of fifth bits, then
        // 16 bytes of scales.
        let scales =
            unsafe { group_scales(chunk.add(PackedWeights::scales_at(WeightFormat::Q5_0))) };
        for r in 0..GROUP {
            // SAFETY: as above.
            unsafe {
                let packed = _mm256_loadu_si256(chunk.add(r * 32).cast());
                let both = _mm512_broadcast_i64x4(packed);
                let shifted = _mm512_mask_srli_epi16::<4>(both, 0xFFFF_0000, both);
                let high = chunk
                    .add(PackedWeights::high_bits_at() + 8 * r)
                    .cast::<u64>()
                    .read_unaligned();
                x[r] = _mm512_or_si512(
                    _mm512_and_si512(shifted, low),
                    _mm512_maskz_mov_epi8(high, fifth),
                );
                dx[r] = pair_bcast(scales.as_ptr().add(2 * r));
            }
        }
        for t in 0..T {
            let at = (t0 + t) * pairs + p;
            // SAFETY: activation row `t0 + t`, pair `p` and its 16 corrections are in
            // bounds (caller).
            let (y, dy, corr) = unsafe {
                (
                    _mm512_loadu_si512(a.qs.as_ptr().add(at * PAIR).cast()),
                    pair_bcast(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                    _mm512_loadu_si512(a.corr.as_ptr().add(at * 16).cast()),
                )
            };
            for r in 0..GROUP {
                let dot = _mm512_dpbusd_epi32(corr, x[r], y);
                acc[r][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dx[r], dy), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; GROUP];
    for (row, accs) in out.iter_mut().zip(&acc) {
        for (v, a) in row.iter_mut().zip(accs) {
            *v = _mm512_reduce_add_ps(*a);
        }
    }
    out
}
