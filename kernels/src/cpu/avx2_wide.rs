//! AVX2 kernels over one chunk group of sixteen rows ([`crate::cpu::layout_wide`]),
//! eight rows (one half of each quad) at a time: per block and activation row, byte
//! products of each quad against a broadcast of the activation's four matching quants,
//! summed to one 32-bit lane per row, then scaled by `d_w · d_a` (plus `m · s` for Q4_1)
//! and accumulated in f32, block after block. Q8_0 multiplies `|w|` by `y` with `w`'s
//! sign (unsigned × signed bytes, exact); Q4_1 and Q5_0 multiply their unsigned quants
//! directly, Q5_0's sums starting from the block's correction `-16 × Σy`.

// Tiles index register arrays by token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::avx512_wide::{Q4_1, Q5_0, Q8_0};
use crate::cpu::layout::{PackedWeights, PAIR};
use crate::cpu::layout_wide::{scales_at, HIGH_AT, OFFSETS_AT, QUAD, QUADS, WIDE};
use crate::cpu::tile_out::TileOut;
use crate::cpu::x86::{bytes_from_bits, nibbles256, quad_of};

/// Rows per 256-bit register.
const HALF: usize = WIDE / 2;

/// Rows `8h..8h+8` of quad `i` of a chunk as 32 bytes, value `v` of those rows in byte
/// `v`: unsigned for Q4_1 and Q5_0, signed `q` for Q8_0.
///
/// # Safety
/// `chunk` must point to a whole chunk of format `F`; AVX2 must be present.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn half_quad<const F: u8>(chunk: *const u8, i: usize, h: usize) -> __m256i {
    // SAFETY: quad `i` of a chunk is in bounds (caller).
    unsafe {
        if F == Q8_0 {
            let stored = _mm256_loadu_si256(chunk.add(i * QUAD + 4 * HALF * h).cast());
            return _mm256_xor_si256(stored, _mm256_set1_epi8(-128));
        }
        let low = nibbles256(chunk, i, h);
        if F == Q5_0 {
            let high = chunk
                .add(HIGH_AT + 8 * i + 4 * h)
                .cast::<u32>()
                .read_unaligned();
            let fifth = _mm256_and_si256(bytes_from_bits(high), _mm256_set1_epi8(0x10));
            return _mm256_or_si256(low, fifth);
        }
        low
    }
}

/// Rows `r0..r0+16` (one group) of format `F` times activation rows `t0..t0+T`, into
/// `out`.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `w` of format `F`, `r0` a multiple of [`WIDE`]
/// below the padded rows, `t0 + T` within `a`, `a` made for `w`'s format and width, and
/// `out` a tile of `T` rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile<const F: u8, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
    out: TileOut,
) {
    let pairs = w.pairs;
    let scales = scales_at(w.format);
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); T];
        for p in 0..pairs {
            let chunk = w.chunk(r0, p).as_ptr();
            for k in 0..2 {
                let half = 2 * (WIDE * k + HALF * h);
                // SAFETY: a chunk's scales (and Q4_1's offsets) are 2 × 16 f16 each.
                let dx =
                    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(chunk.add(scales + half).cast())) };
                let mut sums = [_mm256_setzero_si256(); T];
                if F == Q5_0 {
                    for t in 0..T {
                        // SAFETY: activation row `t0 + t` has 2 corrections per pair
                        // (caller).
                        sums[t] = _mm256_set1_epi32(unsafe {
                            *a.block_corr.get_unchecked((t0 + t) * 2 * pairs + 2 * p + k)
                        });
                    }
                }
                for j in 0..QUADS / 2 {
                    let i = 2 * j + k;
                    // SAFETY: `chunk` is a whole chunk of format `F`.
                    let q = unsafe { half_quad::<F>(chunk, i, h) };
                    let uq = if F == Q8_0 { _mm256_sign_epi8(q, q) } else { q };
                    for t in 0..T {
                        // SAFETY: activation row `t0 + t`, pair `p` holds 64 quants
                        // (caller).
                        let y = _mm256_set1_epi32(unsafe {
                            quad_of(a.qs.as_ptr().add(((t0 + t) * pairs + p) * PAIR + 4 * i))
                        });
                        let y = if F == Q8_0 { _mm256_sign_epi8(y, q) } else { y };
                        sums[t] = _mm256_add_epi32(
                            sums[t],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(uq, y), ones),
                        );
                    }
                }
                let at = |t: usize| (t0 + t) * 2 * pairs + 2 * p + k;
                for t in 0..T {
                    // SAFETY: activation row `t0 + t` has 2 scales per pair (caller).
                    let dy = unsafe { *a.d.get_unchecked(at(t)) };
                    acc[t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(sums[t]),
                        _mm256_mul_ps(dx, _mm256_set1_ps(dy)),
                        acc[t],
                    );
                }
                if F == Q4_1 {
                    // SAFETY: as for the scales.
                    let m = unsafe {
                        _mm256_cvtph_ps(_mm_loadu_si128(chunk.add(OFFSETS_AT + half).cast()))
                    };
                    for t in 0..T {
                        // SAFETY: activation row `t0 + t` has 2 Q8_1 sums per pair (caller).
                        let s = unsafe { *a.s.get_unchecked(at(t)) };
                        acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(s), acc[t]);
                    }
                }
            }
        }
        for t in 0..T {
            // SAFETY: `out` is a tile of `T` rows (caller).
            unsafe { out.put256(t, h, acc[t]) };
        }
    }
}
