//! AVX-512 VNNI kernels over one chunk group of sixteen rows
//! ([`crate::cpu::layout_wide`]): per block and activation row, eight `vpdpbusd` of a quad
//! of the weights (one row per 32-bit lane, unsigned) by a broadcast of the activation's
//! four matching quants, started from the block's correction `-bias × Σy`; the exact
//! integer sums are then scaled by `d_w · d_a` (plus `m · s` for Q4_1) and accumulated in
//! f32, block after block. A quad is unpacked once per tile and serves all its activation
//! rows.

// Tiles index register arrays by token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, PAIR};
use crate::cpu::layout_wide::{scales_at, HIGH_AT, OFFSETS_AT, QUAD, QUADS, WIDE};
use crate::cpu::tile_out::TileOut;
use crate::cpu::x86::{nibbles512, quad_of};

/// Kernel selectors (the const parameter of [`tile`]).
pub(crate) const Q4_1: u8 = 0;
pub(crate) const Q5_0: u8 = 1;
pub(crate) const Q8_0: u8 = 2;

/// Quad `i` of a chunk as 64 unsigned bytes, value `v` in byte `v`.
///
/// # Safety
/// `chunk` must point to a whole chunk of format `F`; AVX-512 F/BW must be present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quad<const F: u8>(chunk: *const u8, i: usize) -> __m512i {
    // SAFETY: quad `i` of a chunk is in bounds (caller).
    unsafe {
        if F == Q8_0 {
            return _mm512_loadu_si512(chunk.add(i * QUAD).cast());
        }
        let low = nibbles512(chunk, i);
        if F == Q5_0 {
            let high = chunk.add(HIGH_AT + 8 * i).cast::<u64>().read_unaligned();
            return _mm512_or_si512(low, _mm512_maskz_mov_epi8(high, _mm512_set1_epi8(0x10)));
        }
        low
    }
}

/// Rows `r0..r0+16` (one group) of format `F` times activation rows `t0..t0+T`, into
/// `out`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be present; `w` of format `F`, `r0` a multiple of
/// [`WIDE`] below the padded rows, `t0 + T` within `a`, `a` made for `w`'s format and
/// width, and `out` a tile of `T` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn tile<const F: u8, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
    out: TileOut,
) {
    let pairs = w.pairs;
    let scales = scales_at(w.format);
    let mut acc = [_mm512_setzero_ps(); T];
    for p in 0..pairs {
        let chunk = w.chunk(r0, p).as_ptr();
        for k in 0..2 {
            // SAFETY: a chunk's scales (and Q4_1's offsets) are 2 × 16 f16 each.
            let dx = unsafe {
                _mm512_cvtph_ps(_mm256_loadu_si256(chunk.add(scales + 2 * WIDE * k).cast()))
            };
            let mut sums = [_mm512_setzero_si512(); T];
            if F != Q4_1 {
                for t in 0..T {
                    // SAFETY: activation row `t0 + t` has 2 corrections per pair (caller).
                    sums[t] = _mm512_set1_epi32(unsafe {
                        *a.block_corr.get_unchecked((t0 + t) * 2 * pairs + 2 * p + k)
                    });
                }
            }
            for j in 0..QUADS / 2 {
                let i = 2 * j + k;
                // SAFETY: `chunk` is a whole chunk of format `F`.
                let wq = unsafe { quad::<F>(chunk, i) };
                for t in 0..T {
                    // SAFETY: activation row `t0 + t`, pair `p` holds 64 quants (caller).
                    let y = unsafe {
                        quad_of(a.qs.as_ptr().add(((t0 + t) * pairs + p) * PAIR + 4 * i))
                    };
                    sums[t] = _mm512_dpbusd_epi32(sums[t], wq, _mm512_set1_epi32(y));
                }
            }
            let at = |t: usize| (t0 + t) * 2 * pairs + 2 * p + k;
            for t in 0..T {
                // SAFETY: activation row `t0 + t` has 2 scales per pair (caller).
                let dy = unsafe { *a.d.get_unchecked(at(t)) };
                acc[t] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(sums[t]),
                    _mm512_mul_ps(dx, _mm512_set1_ps(dy)),
                    acc[t],
                );
            }
            if F == Q4_1 {
                // SAFETY: as for the scales.
                let m = unsafe {
                    _mm512_cvtph_ps(_mm256_loadu_si256(
                        chunk.add(OFFSETS_AT + 2 * WIDE * k).cast(),
                    ))
                };
                for t in 0..T {
                    // SAFETY: activation row `t0 + t` has 2 Q8_1 sums per pair (caller).
                    let s = unsafe { *a.s.get_unchecked(at(t)) };
                    acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(s), acc[t]);
                }
            }
        }
    }
    for t in 0..T {
        // SAFETY: `out` is a tile of `T` rows (caller).
        unsafe { out.put512(t, acc[t]) };
    }
}
