//! AVX2 kernels for the k-quants over one group of four weight rows and one super-block
//! at a time: 32 values per register, unsigned weight bytes times signed Q8_K bytes summed
//! in pairs (`vpmaddubsw`), then in pairs again with the sub-block scale (`vpmaddwd`), so a
//! super-block's integer sum is exact before it is scaled by `d_w·d_a` in f32.

// Tiles index register arrays by row and token; ranges read clearer than iterators here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, GROUP, QK_K};
use crate::cpu::layout_k::at;

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum128(s: __m128) -> f32 {
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The four rows' f16 values at `p` as f32.
///
/// # Safety
/// `p` must point to 8 readable bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn four_f16(p: *const u8) -> [f32; 4] {
    let mut out = [0f32; 4];
    // SAFETY: 8 bytes readable (caller); `out` holds 4 f32.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_cvtph_ps(_mm_loadl_epi64(p.cast()))) };
    out
}

/// Q4_K rows `r0..r0+4` (one group) times Q8_K rows `t0..t0+T`.
///
/// # Safety
/// AVX2, FMA and F16C must be present; `r0` a multiple of [`GROUP`] below the padded
/// rows, `t0 + T` within `a`, and `a` made for `w`'s format and width.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let sbs = w.pairs;
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = [[_mm256_setzero_ps(); T]; GROUP];
    let mut mins_acc = [[_mm_setzero_ps(); T]; GROUP];
    for sb in 0..sbs {
        let chunk = w.chunk(r0, sb).as_ptr();
        // SAFETY: a Q4_K chunk holds every field at the offsets of `at`.
        let (d, dmin) = unsafe {
            (
                four_f16(chunk.add(at::Q4K_D)),
                four_f16(chunk.add(at::Q4K_DMIN)),
            )
        };
        let mut dy = [0f32; T];
        let mut sums = [_mm_setzero_si128(); T];
        for t in 0..T {
            let at = (t0 + t) * sbs + sb;
            // SAFETY: activation row `t0 + t` and super-block `sb` are in bounds (caller).
            unsafe {
                dy[t] = *a.d.get_unchecked(at);
                sums[t] = _mm_loadu_si128(a.sums32.as_ptr().add(at * 8).cast());
            }
        }
        for r in 0..GROUP {
            // SAFETY: as above.
            let (mins, sc) = unsafe {
                (
                    _mm_cvtepu8_epi16(_mm_loadl_epi64(chunk.add(at::Q4K_MIN + 8 * r).cast())),
                    std::slice::from_raw_parts(chunk.add(at::Q4K_SC + 8 * r), 8),
                )
            };
            let mut isum = [_mm256_setzero_si256(); T];
            for c in 0..4 {
                // SAFETY: as above.
                let packed =
                    unsafe { _mm256_loadu_si256(chunk.add(at::QS + 128 * r + 32 * c).cast()) };
                let lo = _mm256_and_si256(packed, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low);
                let (s_lo, s_hi) = (
                    _mm256_set1_epi16(i16::from(sc[2 * c])),
                    _mm256_set1_epi16(i16::from(sc[2 * c + 1])),
                );
                for t in 0..T {
                    let base = ((t0 + t) * sbs + sb) * QK_K + 64 * c;
                    // SAFETY: as above.
                    let (y0, y1) = unsafe {
                        (
                            _mm256_loadu_si256(a.qs.as_ptr().add(base).cast()),
                            _mm256_loadu_si256(a.qs.as_ptr().add(base + 32).cast()),
                        )
                    };
                    let p = _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y0), s_lo),
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y1), s_hi),
                    );
                    isum[t] = _mm256_add_epi32(isum[t], p);
                }
            }
            for t in 0..T {
                acc[r][t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(isum[t]),
                    _mm256_set1_ps(d[r] * dy[t]),
                    acc[r][t],
                );
                let m = _mm_madd_epi16(mins, sums[t]);
                mins_acc[r][t] = _mm_fmadd_ps(
                    _mm_cvtepi32_ps(m),
                    _mm_set1_ps(dmin[r] * dy[t]),
                    mins_acc[r][t],
                );
            }
        }
    }
    let mut out = [[0f32; T]; GROUP];
    for r in 0..GROUP {
        for t in 0..T {
            out[r][t] = hsum(acc[r][t]) - hsum128(mins_acc[r][t]);
        }
    }
    out
}

/// Q6_K rows `r0..r0+4` (one group) times Q8_K rows `t0..t0+T`: six-bit `q` multiplied
/// unsigned, the `−32` taken back per sub-block through the activation's sums of 16.
///
/// # Safety
/// As for [`q4k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6k<const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; GROUP] {
    let sbs = w.pairs;
    let low = _mm256_set1_epi8(0x0F);
    let two = _mm256_set1_epi8(0x30);
    let mut acc = [[_mm256_setzero_ps(); T]; GROUP];
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
            let (sc16, sc) = unsafe {
                (
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(chunk.add(at::Q6K_SC + 16 * r).cast())),
                    std::slice::from_raw_parts(chunk.add(at::Q6K_SC + 16 * r).cast::<i8>(), 16),
                )
            };
            let mut isum = [_mm256_setzero_si256(); T];
            for t in 0..T {
                // SAFETY: as above.
                let bsums = unsafe {
                    _mm256_loadu_si256(a.bsums.as_ptr().add(((t0 + t) * sbs + sb) * 16).cast())
                };
                isum[t] = _mm256_sub_epi32(
                    isum[t],
                    _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bsums)),
                );
            }
            for n in 0..2 {
                // SAFETY: as above.
                let (l0, l1, h) = unsafe {
                    let ql = chunk.add(at::QS + 128 * r + 64 * n);
                    (
                        _mm256_loadu_si256(ql.cast()),
                        _mm256_loadu_si256(ql.add(32).cast()),
                        _mm256_loadu_si256(chunk.add(at::Q6K_QH + 64 * r + 32 * n).cast()),
                    )
                };
                // Value 128n + 32k + l: low bits from l0/l1, high bits 2k, 2k+1 of h.
                let x = [
                    _mm256_or_si256(
                        _mm256_and_si256(l0, low),
                        _mm256_and_si256(_mm256_slli_epi16::<4>(h), two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(l1, low),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(h), two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(l0), low),
                        _mm256_and_si256(h, two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(l1), low),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(h), two),
                    ),
                ];
                for (k, x) in x.into_iter().enumerate() {
                    let j = 8 * n + 2 * k;
                    let scale = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(sc[j + 1])),
                        _mm_set1_epi16(i16::from(sc[j])),
                    );
                    for t in 0..T {
                        // SAFETY: as above.
                        let y = unsafe {
                            _mm256_loadu_si256(
                                a.qs.as_ptr()
                                    .add(((t0 + t) * sbs + sb) * QK_K + 128 * n + 32 * k)
                                    .cast(),
                            )
                        };
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), scale);
                        isum[t] = _mm256_add_epi32(isum[t], p);
                    }
                }
            }
            for t in 0..T {
                acc[r][t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(isum[t]),
                    _mm256_set1_ps(d[r] * dy[t]),
                    acc[r][t],
                );
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
