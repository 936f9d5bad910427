//! The AVX-512 VNNI Q8_0 kernel over one chunk group of sixteen rows
//! ([`crate::cpu::layout_q8`]): per block and activation row, eight `vpdpbusd` of a quad
//! of the weights (one row per 32-bit lane) by a broadcast of the activation's four
//! matching quants, started from the block's correction `-128 × Σy`; the exact integer
//! sums are then scaled by `d_w · d_a` and accumulated in f32, block after block.

// Tiles index register arrays by token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, PAIR};
use crate::cpu::layout_q8::{QUAD, SCALES_AT, WIDE};

/// Q8_0 rows `r0..r0+16` (one group) times Q8_0 rows `t0..t0+T`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C must be present; `r0` a multiple of [`WIDE`] below the
/// padded rows, `t0 + T` within `a`, and `a` made for `w`'s format and width.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub unsafe fn q8_0<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; WIDE] {
    let pairs = w.pairs;
    let mut acc = [_mm512_setzero_ps(); T];
    for p in 0..pairs {
        let chunk = w.chunk(r0, p).as_ptr();
        for k in 0..2 {
            // SAFETY: a chunk's scales are 2 × 16 f16 at SCALES_AT.
            let dx = unsafe {
                _mm512_cvtph_ps(_mm256_loadu_si256(
                    chunk.add(SCALES_AT + 2 * WIDE * k).cast(),
                ))
            };
            let mut sums = [_mm512_setzero_si512(); T];
            for t in 0..T {
                // SAFETY: activation row `t0 + t` has 2 corrections per pair (caller).
                sums[t] = _mm512_set1_epi32(unsafe {
                    *a.block_corr.get_unchecked((t0 + t) * 2 * pairs + 2 * p + k)
                });
            }
            for j in 0..PAIR / 8 {
                let i = 2 * j + k;
                // SAFETY: a chunk holds 16 quads of QUAD bytes.
                let wq = unsafe { _mm512_loadu_si512(chunk.add(i * QUAD).cast()) };
                for t in 0..T {
                    // SAFETY: activation row `t0 + t`, pair `p` holds PAIR quants (caller).
                    let y = unsafe {
                        a.qs.as_ptr()
                            .add(((t0 + t) * pairs + p) * PAIR + 4 * i)
                            .cast::<i32>()
                            .read_unaligned()
                    };
                    sums[t] = _mm512_dpbusd_epi32(sums[t], wq, _mm512_set1_epi32(y));
                }
            }
            for t in 0..T {
                // SAFETY: activation row `t0 + t` has 2 scales per pair (caller).
                let dy = unsafe { *a.d.get_unchecked((t0 + t) * 2 * pairs + 2 * p + k) };
                acc[t] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(sums[t]),
                    _mm512_mul_ps(dx, _mm512_set1_ps(dy)),
                    acc[t],
                );
            }
        }
    }
    let mut lanes = [[0f32; WIDE]; T];
    for t in 0..T {
        // SAFETY: `lanes[t]` holds 16 f32.
        unsafe { _mm512_storeu_ps(lanes[t].as_mut_ptr(), acc[t]) };
    }
    std::array::from_fn(|r| std::array::from_fn(|t| lanes[t][r]))
}
