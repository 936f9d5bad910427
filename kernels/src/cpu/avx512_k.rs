//! AVX-512 VNNI kernels for the k-quants over one chunk group of sixteen rows
//! ([`crate::cpu::layout_k`]), one super-block at a time: per sub-block and activation
//! row, `vpdpbusd` of each quad of the weights (one row per 32-bit lane, unsigned) by a
//! broadcast of the activation's four matching quants, then times the rows' sub-block
//! scales, so a super-block's integer sum is exact (as ggml's) before it is scaled by
//! `d_w·d_a` in f32. Q4_K's mins come from `vpdpwssd` of the rows' min pairs by the
//! activation's sums of 32; Q6_K's `−32` from each sub-block's sum starting at
//! `−32 × Σy`.

// Tiles index register arrays by token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, QK_K};
use crate::cpu::layout_k::at;
use crate::cpu::layout_wide::WIDE;
use crate::cpu::tile_out::TileOut;
use crate::cpu::x86::{nibbles512, quad_of};

/// Sixteen f16 at `p` as f32.
///
/// # Safety
/// `p` must point to 32 readable bytes; AVX-512F must be present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn f16x16(p: *const u8) -> __m512 {
    // SAFETY: 32 bytes readable (caller).
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
}

/// Four activation quants at `p`, broadcast.
///
/// # Safety
/// `p` must point to 4 readable bytes; AVX-512F must be present.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn quad_bcast(p: *const i8) -> __m512i {
    // SAFETY: 4 bytes readable (caller).
    _mm512_set1_epi32(unsafe { quad_of(p) })
}

/// Q4_K rows `r0..r0+16` (one group) times Q8_K rows `t0..t0+T`, into `out`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be present; `r0` a multiple of [`WIDE`] below the
/// padded rows, `t0 + T` within `a`, `a` made for `w`'s format and width, and `out` a
/// tile of `T` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn q4k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
    out: TileOut,
) {
    let sbs = w.pairs;
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..sbs {
        let chunk = w.chunk(r0, sb).as_ptr();
        let y = |t: usize, i: usize| {
            // SAFETY: activation row `t0 + t`, super-block `sb` holds 256 quants (caller).
            unsafe { a.qs.as_ptr().add(((t0 + t) * sbs + sb) * QK_K + 4 * i) }
        };
        let mut isum = [_mm512_setzero_si512(); T];
        for j in 0..8 {
            // SAFETY: a Q4_K chunk holds every field at the offsets of `at`.
            let sc = unsafe {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(chunk.add(at::Q4K_SC + WIDE * j).cast()))
            };
            let mut dot = [_mm512_setzero_si512(); T];
            for i in 8 * j..8 * j + 8 {
                // SAFETY: as above.
                let x = unsafe { nibbles512(chunk, i) };
                for t in 0..T {
                    // SAFETY: as above.
                    dot[t] = _mm512_dpbusd_epi32(dot[t], x, unsafe { quad_bcast(y(t, i)) });
                }
            }
            for t in 0..T {
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
            }
        }
        let mut mins = [_mm512_setzero_si512(); T];
        for k in 0..4 {
            // SAFETY: as above.
            let m = unsafe {
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                    chunk.add(at::Q4K_MIN + 2 * WIDE * k).cast(),
                ))
            };
            for t in 0..T {
                // SAFETY: activation row `t0 + t` has 8 sums of 32 per super-block
                // (caller); two of them are one 32-bit pair.
                let s = unsafe {
                    a.sums32
                        .as_ptr()
                        .add(((t0 + t) * sbs + sb) * 8 + 2 * k)
                        .cast::<i32>()
                        .read_unaligned()
                };
                mins[t] = _mm512_dpwssd_epi32(mins[t], m, _mm512_set1_epi32(s));
            }
        }
        // SAFETY: as above.
        let (d, dmin) = unsafe {
            (
                f16x16(chunk.add(at::Q4K_D)),
                f16x16(chunk.add(at::Q4K_DMIN)),
            )
        };
        for t in 0..T {
            // SAFETY: activation row `t0 + t` has a scale per super-block (caller).
            let dy = _mm512_set1_ps(unsafe { *a.d.get_unchecked((t0 + t) * sbs + sb) });
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dy), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[t]), _mm512_mul_ps(dmin, dy), acc[t]);
        }
    }
    for t in 0..T {
        // SAFETY: `out` is a tile of `T` rows (caller).
        unsafe { out.put512(t, acc[t]) };
    }
}

/// Q6_K rows `r0..r0+16` (one group) times Q8_K rows `t0..t0+T`, into `out`.
///
/// # Safety
/// As for [`q4k`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn q6k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
    out: TileOut,
) {
    let sbs = w.pairs;
    let (fifth, sixth) = (_mm512_set1_epi8(0x10), _mm512_set1_epi8(0x20));
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..sbs {
        let chunk = w.chunk(r0, sb).as_ptr();
        let row = |t: usize| (t0 + t) * sbs + sb;
        let mut isum = [_mm512_setzero_si512(); T];
        for j in 0..16 {
            // SAFETY: a Q6_K chunk holds every field at the offsets of `at`.
            let sc = unsafe {
                _mm512_cvtepi8_epi32(_mm_loadu_si128(chunk.add(at::Q6K_SC + WIDE * j).cast()))
            };
            let mut dot = [_mm512_setzero_si512(); T];
            for t in 0..T {
                // SAFETY: activation row `t0 + t` has 16 sums of 16 per super-block (caller).
                let s = i32::from(unsafe { *a.bsums.get_unchecked(row(t) * 16 + j) });
                dot[t] = _mm512_set1_epi32(-32 * s);
            }
            for i in 4 * j..4 * j + 4 {
                // SAFETY: as above.
                let x = unsafe {
                    let high = chunk.add(at::Q6K_QH + 16 * i).cast::<u64>();
                    let x = _mm512_or_si512(
                        nibbles512(chunk, i),
                        _mm512_maskz_mov_epi8(high.read_unaligned(), fifth),
                    );
                    _mm512_or_si512(
                        x,
                        _mm512_maskz_mov_epi8(high.add(1).read_unaligned(), sixth),
                    )
                };
                for t in 0..T {
                    // SAFETY: activation row `t0 + t`, super-block `sb` holds 256 quants
                    // (caller).
                    let y = unsafe { quad_bcast(a.qs.as_ptr().add(row(t) * QK_K + 4 * i)) };
                    dot[t] = _mm512_dpbusd_epi32(dot[t], x, y);
                }
            }
            for t in 0..T {
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
            }
        }
        // SAFETY: as above.
        let d = unsafe { f16x16(chunk.add(at::Q6K_D)) };
        for t in 0..T {
            // SAFETY: activation row `t0 + t` has a scale per super-block (caller).
            let dy = _mm512_set1_ps(unsafe { *a.d.get_unchecked(row(t)) });
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dy), acc[t]);
        }
    }
    for t in 0..T {
        // SAFETY: `out` is a tile of `T` rows (caller).
        unsafe { out.put512(t, acc[t]) };
    }
}
