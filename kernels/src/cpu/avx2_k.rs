//! AVX2 kernels for the k-quants over one chunk group of sixteen rows
//! ([`crate::cpu::layout_k`]), eight rows (one half of each quad) at a time and one
//! super-block at a time: per sub-block and activation row, unsigned weight bytes times a
//! broadcast of the activation's four matching quants (`vpmaddubsw`, then `vpmaddwd` by
//! ones), one row per 32-bit lane, then times the rows' sub-block scales, so a
//! super-block's integer sum is exact (as ggml's) before it is scaled by `d_w·d_a` in f32.
//! Q4_K's mins come from `vpmaddwd` of the rows' min pairs by the activation's sums of
//! 32; Q6_K's `−32` from each sub-block's sum starting at `−32 × Σy`.

// Tiles index register arrays by token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, QK_K};
use crate::cpu::layout_k::at;
use crate::cpu::layout_wide::WIDE;
use crate::cpu::tile_out::TileOut;
use crate::cpu::x86::{bytes_from_bits, nibbles256, quad_of};

/// Rows per 256-bit register.
const HALF: usize = WIDE / 2;

/// Eight f16 at `p` as f32.
///
/// # Safety
/// `p` must point to 16 readable bytes; F16C must be present.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16x8(p: *const u8) -> __m256 {
    // SAFETY: 16 bytes readable (caller).
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
}

/// `x · y` summed per 32-bit lane: unsigned bytes `x` (below 64) by signed bytes `y`.
#[inline]
#[target_feature(enable = "avx2")]
fn dot4(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// Four activation quants at `p` as one broadcast 32-bit value.
///
/// # Safety
/// `p` must point to 4 readable bytes; AVX2 must be present.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn quad_bcast(p: *const i8) -> __m256i {
    // SAFETY: 4 bytes readable (caller).
    _mm256_set1_epi32(unsafe { quad_of(p) })
}

/// Q4_K rows `r0..r0+16` (one group) times Q8_K rows `t0..t0+T`, into `out`.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `r0` a multiple of [`WIDE`] below the padded
/// rows, `t0 + T` within `a`, `a` made for `w`'s format and width, and `out` a tile of
/// `T` rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
    out: TileOut,
) {
    let sbs = w.pairs;
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); T];
        for sb in 0..sbs {
            let chunk = w.chunk(r0, sb).as_ptr();
            let row = |t: usize| (t0 + t) * sbs + sb;
            let mut isum = [_mm256_setzero_si256(); T];
            for j in 0..8 {
                // SAFETY: a Q4_K chunk holds every field at the offsets of `at`.
                let sc = unsafe {
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        chunk.add(at::Q4K_SC + WIDE * j + HALF * h).cast(),
                    ))
                };
                let mut dot = [_mm256_setzero_si256(); T];
                for i in 8 * j..8 * j + 8 {
                    // SAFETY: as above.
                    let x = unsafe { nibbles256(chunk, i, h) };
                    for t in 0..T {
                        // SAFETY: activation row `t0 + t`, super-block `sb` holds 256
                        // quants (caller).
                        let y = unsafe { quad_bcast(a.qs.as_ptr().add(row(t) * QK_K + 4 * i)) };
                        dot[t] = _mm256_add_epi32(dot[t], dot4(x, y));
                    }
                }
                for t in 0..T {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(dot[t], sc));
                }
            }
            let mut mins = [_mm256_setzero_si256(); T];
            for k in 0..4 {
                // SAFETY: as above.
                let m = unsafe {
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(
                        chunk.add(at::Q4K_MIN + 2 * WIDE * k + 2 * HALF * h).cast(),
                    ))
                };
                for t in 0..T {
                    // SAFETY: activation row `t0 + t` has 8 sums of 32 per super-block
                    // (caller); two of them are one 32-bit pair.
                    let s = unsafe {
                        a.sums32
                            .as_ptr()
                            .add(row(t) * 8 + 2 * k)
                            .cast::<i32>()
                            .read_unaligned()
                    };
                    mins[t] = _mm256_add_epi32(mins[t], _mm256_madd_epi16(m, _mm256_set1_epi32(s)));
                }
            }
            // SAFETY: as above.
            let (d, dmin) = unsafe {
                (
                    f16x8(chunk.add(at::Q4K_D + 2 * HALF * h)),
                    f16x8(chunk.add(at::Q4K_DMIN + 2 * HALF * h)),
                )
            };
            for t in 0..T {
                // SAFETY: activation row `t0 + t` has a scale per super-block (caller).
                let dy = _mm256_set1_ps(unsafe { *a.d.get_unchecked(row(t)) });
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dy), acc[t]);
                acc[t] =
                    _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins[t]), _mm256_mul_ps(dmin, dy), acc[t]);
            }
        }
        for t in 0..T {
            // SAFETY: `out` is a tile of `T` rows (caller).
            unsafe { out.put256(t, h, acc[t]) };
        }
    }
}

/// Q6_K rows `r0..r0+16` (one group) times Q8_K rows `t0..t0+T`, into `out`.
///
/// # Safety
/// As for [`q4k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
    out: TileOut,
) {
    let sbs = w.pairs;
    let (fifth, sixth) = (_mm256_set1_epi8(0x10), _mm256_set1_epi8(0x20));
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); T];
        for sb in 0..sbs {
            let chunk = w.chunk(r0, sb).as_ptr();
            let row = |t: usize| (t0 + t) * sbs + sb;
            let mut isum = [_mm256_setzero_si256(); T];
            for j in 0..16 {
                // SAFETY: a Q6_K chunk holds every field at the offsets of `at`.
                let sc = unsafe {
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                        chunk.add(at::Q6K_SC + WIDE * j + HALF * h).cast(),
                    ))
                };
                let mut dot = [_mm256_setzero_si256(); T];
                for t in 0..T {
                    // SAFETY: activation row `t0 + t` has 16 sums of 16 per super-block
                    // (caller).
                    let s = i32::from(unsafe { *a.bsums.get_unchecked(row(t) * 16 + j) });
                    dot[t] = _mm256_set1_epi32(-32 * s);
                }
                for i in 4 * j..4 * j + 4 {
                    // SAFETY: as above.
                    let x = unsafe {
                        let high = chunk.add(at::Q6K_QH + 16 * i + 4 * h).cast::<u32>();
                        let x = _mm256_or_si256(
                            nibbles256(chunk, i, h),
                            _mm256_and_si256(bytes_from_bits(high.read_unaligned()), fifth),
                        );
                        let six = bytes_from_bits(high.add(2).read_unaligned());
                        _mm256_or_si256(x, _mm256_and_si256(six, sixth))
                    };
                    for t in 0..T {
                        // SAFETY: activation row `t0 + t`, super-block `sb` holds 256
                        // quants (caller).
                        let y = unsafe { quad_bcast(a.qs.as_ptr().add(row(t) * QK_K + 4 * i)) };
                        dot[t] = _mm256_add_epi32(dot[t], dot4(x, y));
                    }
                }
                for t in 0..T {
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(dot[t], sc));
                }
            }
            // SAFETY: as above.
            let d = unsafe { f16x8(chunk.add(at::Q6K_D + 2 * HALF * h)) };
            for t in 0..T {
                // SAFETY: activation row `t0 + t` has a scale per super-block (caller).
                let dy = _mm256_set1_ps(unsafe { *a.d.get_unchecked(row(t)) });
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, dy), acc[t]);
            }
        }
        for t in 0..T {
            // SAFETY: `out` is a tile of `T` rows (caller).
            unsafe { out.put256(t, h, acc[t]) };
        }
    }
}
