//! AVX2 + FMA kernels over one group of four weight rows: per pair of blocks, byte
//! products summed to eight 32-bit lanes (even lanes the first block, odd lanes the
//! second), scaled and accumulated in f32. Q8_0 has its own layout and kernel
//! ([`crate::cpu::avx2_q8`]).

// Tiles index register arrays by row and token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, WeightFormat, GROUP, PAIR};
use crate::cpu::x86::{bytes_from_bits, group_scales, pair_bcast256};

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

/// Q4_1 rows `r0..r0+4` (one group) times Q8_1 rows `t0..t0+T`.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `r0` a multiple of [`GROUP`] below the padded
/// rows, `t0 + T` within `a`, and `a` made for `w`'s format and width.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_1<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let pairs = w.pairs;
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); T]; GROUP];
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
        let mut lo = [_mm256_setzero_si256(); GROUP];
        let mut hi = [_mm256_setzero_si256(); GROUP];
        let mut dx = [_mm256_setzero_ps(); GROUP];
        // SAFETY: a chunk holds 4 × 32 quant bytes, then 16 bytes of scales.
        let scales = unsafe { group_scales(chunk.add(GROUP * 32)) };
        for r in 0..GROUP {
            // SAFETY: as above.
            unsafe {
                let packed = _mm256_loadu_si256(chunk.add(r * 32).cast());
                lo[r] = _mm256_and_si256(packed, low);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low);
                dx[r] = pair_bcast256(scales.as_ptr().add(2 * r));
            }
        }
        for t in 0..T {
            let base = ((t0 + t) * pairs + p) * PAIR;
            // SAFETY: activation row `t0 + t` and pair `p` are in bounds (caller).
            let (y0, y1, dy) = unsafe {
                (
                    _mm256_loadu_si256(a.qs.as_ptr().add(base).cast()),
                    _mm256_loadu_si256(a.qs.as_ptr().add(base + 32).cast()),
                    pair_bcast256(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                )
            };
            // SAFETY: the activation's Q8_1 sums of pair `p` are in bounds (caller).
            let s = unsafe { pair_bcast256(a.s.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)) };
            offs[t] = _mm256_fmadd_ps(m, s, offs[t]);
            for r in 0..GROUP {
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
    let mut out = [[0f32; T]; GROUP];
    for (t, o) in offs.iter().enumerate() {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds eight f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *o) };
        for (r, row) in out.iter_mut().enumerate() {
            row[t] = hsum(acc[r][t]) + (lanes[2 * r] + lanes[2 * r + 1]);
        }
    }
    out
}

/// Q5_0 rows `r0..r0+4` (one group) times Q8_0 rows `t0..t0+T`: `q + 16` from its low
/// nibble and fifth bit, multiplied unsigned; each lane adds the two 16-lane
/// corrections `-16 × Σy` it covers.
///
/// # Safety
/// As for [`q4_1`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_0<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let pairs = w.pairs;
    let low = _mm256_set1_epi8(0x0F);
    let fifth = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); T]; GROUP];
    for p in 0..pairs {
        let chunk = w.chunk(r0, p).as_ptr();
        let mut lo = [_mm256_setzero_si256(); GROUP];
        let mut hi = [_mm256_setzero_si256(); GROUP];
        let mut dx = [_mm256_setzero_ps(); GROUP];
        // SAFETY: a Q5_0 chunk holds 4 × 32 quant bytes, 4 × 8 bytes of fifth bits, then
        // 16 bytes of scales.
        let scales =
            unsafe { group_scales(chunk.add(PackedWeights::scales_at(WeightFormat::Q5_0))) };
        for r in 0..GROUP {
            // SAFETY: as above.
            unsafe {
                let packed = _mm256_loadu_si256(chunk.add(r * 32).cast());
                let high = chunk
                    .add(PackedWeights::high_bits_at() + 8 * r)
                    .cast::<u64>()
                    .read_unaligned();
                lo[r] = _mm256_or_si256(
                    _mm256_and_si256(packed, low),
                    _mm256_and_si256(bytes_from_bits(high as u32), fifth),
                );
                hi[r] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low),
                    _mm256_and_si256(bytes_from_bits((high >> 32) as u32), fifth),
                );
                dx[r] = pair_bcast256(scales.as_ptr().add(2 * r));
            }
        }
        for t in 0..T {
            let at = (t0 + t) * pairs + p;
            // SAFETY: activation row `t0 + t`, pair `p` and its 16 corrections are in
            // bounds (caller).
            let (y0, y1, dy, corr) = unsafe {
                (
                    _mm256_loadu_si256(a.qs.as_ptr().add(at * PAIR).cast()),
                    _mm256_loadu_si256(a.qs.as_ptr().add(at * PAIR + 32).cast()),
                    pair_bcast256(a.d.as_ptr().add((t0 + t) * 2 * pairs + 2 * p)),
                    _mm256_add_epi32(
                        _mm256_loadu_si256(a.corr.as_ptr().add(at * 16).cast()),
                        _mm256_loadu_si256(a.corr.as_ptr().add(at * 16 + 8).cast()),
                    ),
                )
            };
            for r in 0..GROUP {
                let pairs16 = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo[r], y0),
                    _mm256_maddubs_epi16(hi[r], y1),
                );
                let dot = _mm256_add_epi32(_mm256_madd_epi16(pairs16, ones), corr);
                acc[r][t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dx[r], dy), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; GROUP];
    for (row, accs) in out.iter_mut().zip(&acc) {
        for (v, a) in row.iter_mut().zip(accs) {
            *v = hsum(*a);
        }
    }
    out
}
