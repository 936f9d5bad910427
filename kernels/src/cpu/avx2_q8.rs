//! The AVX2 Q8_0 kernel over one chunk group of sixteen rows
//! ([`crate::cpu::layout_q8`]), eight rows (one half of each quad) at a time: per block
//! and activation row, `|w| · (y with w's sign)` byte products of each quad against a
//! broadcast of the activation's four matching quants, summed to one 32-bit lane per row,
//! then scaled by `d_w · d_a` and accumulated in f32, block after block.

// Tiles index register arrays by token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, PAIR};
use crate::cpu::layout_q8::{QUAD, SCALES_AT, WIDE};

/// Rows per 256-bit register.
const HALF: usize = WIDE / 2;

/// Q8_0 rows `r0..r0+16` (one group) times Q8_0 rows `t0..t0+T`.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `r0` a multiple of [`WIDE`] below the padded
/// rows, `t0 + T` within `a`, and `a` made for `w`'s format and width.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; WIDE] {
    let pairs = w.pairs;
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut out = [[0f32; T]; WIDE];
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); T];
        for p in 0..pairs {
            let chunk = w.chunk(r0, p).as_ptr();
            for k in 0..2 {
                // SAFETY: a chunk's scales are 2 × 16 f16 at SCALES_AT.
                let dx = unsafe {
                    _mm256_cvtph_ps(_mm_loadu_si128(
                        chunk.add(SCALES_AT + 2 * (WIDE * k + HALF * h)).cast(),
                    ))
                };
                let mut sums = [_mm256_setzero_si256(); T];
                for j in 0..PAIR / 8 {
                    let i = 2 * j + k;
                    // SAFETY: a chunk holds 16 quads of QUAD bytes.
                    let q = unsafe {
                        _mm256_xor_si256(
                            _mm256_loadu_si256(chunk.add(i * QUAD + 4 * HALF * h).cast()),
                            flip,
                        )
                    };
                    let aq = _mm256_sign_epi8(q, q);
                    for t in 0..T {
                        // SAFETY: activation row `t0 + t`, pair `p` holds PAIR quants
                        // (caller).
                        let y = unsafe {
                            a.qs.as_ptr()
                                .add(((t0 + t) * pairs + p) * PAIR + 4 * i)
                                .cast::<i32>()
                                .read_unaligned()
                        };
                        let sy = _mm256_sign_epi8(_mm256_set1_epi32(y), q);
                        sums[t] = _mm256_add_epi32(
                            sums[t],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sy), ones),
                        );
                    }
                }
                for t in 0..T {
                    // SAFETY: activation row `t0 + t` has 2 scales per pair (caller).
                    let dy = unsafe { *a.d.get_unchecked((t0 + t) * 2 * pairs + 2 * p + k) };
                    acc[t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(sums[t]),
                        _mm256_mul_ps(dx, _mm256_set1_ps(dy)),
                        acc[t],
                    );
                }
            }
        }
        for t in 0..T {
            let mut lanes = [0f32; HALF];
            // SAFETY: `lanes` holds 8 f32.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[t]) };
            for (r, v) in lanes.iter().enumerate() {
                out[HALF * h + r][t] = *v;
            }
        }
    }
    out
}
