//! AVX-512 kernels for the k-quants over one group of four weight rows and one
//! super-block at a time: 64 values per register, unsigned weight bytes times signed
//! Q8_K bytes summed in pairs (`vpmaddubsw`), then in pairs again with each lane's
//! sub-block scale (`vpmaddwd`), so a super-block's integer sum is exact before it is
//! scaled by `d_w·d_a` in f32.

// Tiles index register arrays by row and token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, GROUP, QK_K};
use crate::cpu::layout_k::at;

/// The four rows' f16 values at `p` as f32.
///
/// # Safety
/// `p` must point to 8 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn four_f16(p: *const u8) -> [f32; 4] {
    let mut out = [0f32; 4];
    // SAFETY: 8 bytes readable (caller); `out` holds 4 f32.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_cvtph_ps(_mm_loadl_epi64(p.cast()))) };
    out
}

/// Sixteen-bit lane indices selecting, for lanes `16h..16h+16`, the scale `first + h`
/// (`h` in 0..2), or for Q6_K's runs, lanes `8h..8h+8` the scale `first + h` (`h` in 0..4).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn scale_index(first: i16, lanes_per_scale: u32) -> __m512i {
    let mut idx = [0i16; 32];
    for (i, v) in idx.iter_mut().enumerate() {
        *v = first + (i as u32 / lanes_per_scale) as i16;
    }
    // SAFETY: `idx` holds 64 bytes.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// Q4_K rows `r0..r0+4` (one group) times Q8_K rows `t0..t0+T`.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C must be present; `r0` a multiple of [`GROUP`] below the padded
/// rows, `t0 + T` within `a`, and `a` made for `w`'s format and width.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub unsafe fn q4k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let sbs = w.pairs;
    let low = _mm512_set1_epi8(0x0F);
    let idx: [__m512i; 4] = std::array::from_fn(|c| scale_index(2 * c as i16, 16));
    // Lane 4r + k holds row r.
    let row_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let mut acc = [[_mm512_setzero_ps(); T]; GROUP];
    let mut mins_acc = [_mm512_setzero_ps(); T];
    for sb in 0..sbs {
        let chunk = w.chunk(r0, sb).as_ptr();
        // SAFETY: a Q4_K chunk holds every field at the offsets of `at`.
        let (d, dmin, mins) = unsafe {
            (
                four_f16(chunk.add(at::Q4K_D)),
                _mm_cvtph_ps(_mm_loadl_epi64(chunk.add(at::Q4K_DMIN).cast())),
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(chunk.add(at::Q4K_MIN).cast())),
            )
        };
        let dmin = _mm512_permutexvar_ps(row_of_lane, _mm512_castps128_ps512(dmin));
        let mut dy = [0f32; T];
        for t in 0..T {
            let at = (t0 + t) * sbs + sb;
            // SAFETY: activation row `t0 + t` and super-block `sb` are in bounds (caller).
            let sums = unsafe {
                dy[t] = *a.d.get_unchecked(at);
                _mm512_broadcast_i32x4(_mm_loadu_si128(a.sums32.as_ptr().add(at * 8).cast()))
            };
            // Lane 4r + k: m_{2k} s_{2k} + m_{2k+1} s_{2k+1} of row r.
            let m = _mm512_madd_epi16(mins, sums);
            mins_acc[t] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(m),
                _mm512_mul_ps(dmin, _mm512_set1_ps(dy[t])),
                mins_acc[t],
            );
        }
        for r in 0..GROUP {
            // SAFETY: as above.
            let sc = unsafe {
                _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(
                    chunk.add(at::Q4K_SC + 8 * r).cast(),
                )))
            };
            let mut isum = [_mm512_setzero_si512(); T];
            for (c, idx) in idx.iter().enumerate() {
                // SAFETY: as above.
                let packed =
                    unsafe { _mm256_loadu_si256(chunk.add(at::QS + 128 * r + 32 * c).cast()) };
                // Low nibbles (sub-block 2c) in the lower half, high (2c + 1) in the upper.
                let both = _mm512_broadcast_i64x4(packed);
                let x = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(both, 0xFFFF_0000, both), low);
                let scale = _mm512_permutexvar_epi16(*idx, sc);
                for t in 0..T {
                    // SAFETY: as above.
                    let y = unsafe {
                        _mm512_loadu_si512(
                            a.qs.as_ptr()
                                .add(((t0 + t) * sbs + sb) * QK_K + 64 * c)
                                .cast(),
                        )
                    };
                    let prod = _mm512_madd_epi16(_mm512_maddubs_epi16(x, y), scale);
                    isum[t] = _mm512_add_epi32(isum[t], prod);
                }
            }
            for t in 0..T {
                acc[r][t] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum[t]),
                    _mm512_set1_ps(d[r] * dy[t]),
                    acc[r][t],
                );
            }
        }
    }
    let mut out = [[0f32; T]; GROUP];
    for t in 0..T {
        let mut lanes = [0f32; 16];
        // SAFETY: `lanes` holds sixteen f32.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), mins_acc[t]) };
        for r in 0..GROUP {
            let mins: f32 = lanes[4 * r..4 * r + 4].iter().sum();
            out[r][t] = _mm512_reduce_add_ps(acc[r][t]) - mins;
        }
    }
    out
}

/// Q6_K rows `r0..r0+4` (one group) times Q8_K rows `t0..t0+T`: six-bit `q` multiplied
/// unsigned, the `−32` taken back per sub-block through the activation's sums of 16.
///
/// # Safety
/// As for [`q4k`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub unsafe fn q6k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let sbs = w.pairs;
    let low = _mm512_set1_epi8(0x0F);
    let two = _mm512_set1_epi8(0x30);
    let idx: [__m512i; 4] = std::array::from_fn(|q| scale_index(4 * q as i16, 8));
    let mut acc = [[_mm512_setzero_ps(); T]; GROUP];
    for sb in 0..sbs {
        let chunk = w.chunk(r0, sb).as_ptr();
        // SAFETY: a Q6_K chunk holds every field at the offsets of `at`.
        let d = unsafe { four_f16(chunk.add(at::Q6K_D)) };
        let mut dy = [0f32; T];
        for t in 0..T {
            // SAFETY: activation row `t0 + t` and super-block `sb` are in bounds (caller).
            dy[t] = unsafe { *a.d.get_unchecked((t0 + t) * sbs + sb) };
        }
        for r in 0..GROUP {
            // SAFETY: as above.
            let sc16 = unsafe {
                _mm256_cvtepi8_epi16(_mm_loadu_si128(chunk.add(at::Q6K_SC + 16 * r).cast()))
            };
            let sc = _mm512_zextsi256_si512(sc16);
            let mut isum = [_mm512_setzero_si512(); T];
            for t in 0..T {
                // SAFETY: as above.
                let bsums = unsafe {
                    _mm256_loadu_si256(a.bsums.as_ptr().add(((t0 + t) * sbs + sb) * 16).cast())
                };
                let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bsums));
                isum[t] = _mm512_sub_epi32(isum[t], _mm512_zextsi256_si512(bias));
            }
            for n in 0..2 {
                // SAFETY: as above.
                let (ql, qh) = unsafe {
                    (
                        _mm512_loadu_si512(chunk.add(at::QS + 128 * r + 64 * n).cast()),
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(
                            chunk.add(at::Q6K_QH + 64 * r + 32 * n).cast(),
                        )),
                    )
                };
                // Values 128n..+64: low nibbles, qh bits 0-1 (lower half) and 2-3 (upper).
                let ha = _mm512_mask_srli_epi16::<2>(qh, 0xFFFF_0000, qh);
                let xa = _mm512_or_si512(
                    _mm512_and_si512(ql, low),
                    _mm512_and_si512(_mm512_slli_epi16::<4>(ha), two),
                );
                // Values 128n+64..+128: high nibbles, qh bits 4-5 and 6-7.
                let hb = _mm512_mask_srli_epi16::<6>(_mm512_srli_epi16::<4>(qh), 0xFFFF_0000, qh);
                let xb = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low),
                    _mm512_and_si512(_mm512_slli_epi16::<4>(hb), two),
                );
                for (k, x) in [xa, xb].into_iter().enumerate() {
                    let q = 2 * n + k;
                    let scale = _mm512_permutexvar_epi16(idx[q], sc);
                    for t in 0..T {
                        // SAFETY: as above.
                        let y = unsafe {
                            _mm512_loadu_si512(
                                a.qs.as_ptr()
                                    .add(((t0 + t) * sbs + sb) * QK_K + 64 * q)
                                    .cast(),
                            )
                        };
                        let prod = _mm512_madd_epi16(_mm512_maddubs_epi16(x, y), scale);
                        isum[t] = _mm512_add_epi32(isum[t], prod);
                    }
                }
            }
            for t in 0..T {
                acc[r][t] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum[t]),
                    _mm512_set1_ps(d[r] * dy[t]),
                    acc[r][t],
                );
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
