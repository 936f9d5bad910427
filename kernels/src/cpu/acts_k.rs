//! Q8_K activation quantization, as ggml quantizes activations for its k-quant dot
//! products: per super-block of 256 values, the value of largest magnitude `max` (with
//! its sign) sets the multiplier `iscale = -127 / max`, quants are
//! `min(127, round_half_even(iscale · x))`, the scale kept is `d = 1 / iscale` in f32, and
//! the sums of each 16 quants ride along. Values stay in the file's order.

use rayon::prelude::*;

use crate::cpu::layout::QK_K;
use crate::round::round_even_i32;

/// Rows from which quantization is split over the thread pool.
const PAR_MIN_ROWS: usize = 4;

/// One super-block: its quants, bsums (16) and sums of 32 (8) written; returns `d`.
fn quantize_block(xs: &[f32], qs: &mut [i8], bsums: &mut [i16], sums32: &mut [i16]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for x in xs {
        if x.abs() > amax {
            amax = x.abs();
            max = *x;
        }
    }
    if amax == 0.0 {
        qs.fill(0);
        bsums.fill(0);
        sums32.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, x) in qs.iter_mut().zip(xs) {
        *q = round_even_i32(iscale * x).min(127) as i8;
    }
    for (s, run) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
        *s = run.iter().map(|v| i16::from(*v)).sum();
    }
    for (s, pair) in sums32.iter_mut().zip(bsums.chunks_exact(2)) {
        *s = pair[0] + pair[1];
    }
    1.0 / iscale
}

fn quantize_row(row: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16], sums32: &mut [i16]) {
    for ((((x, q), d), b), s) in row
        .chunks_exact(QK_K)
        .zip(qs.chunks_exact_mut(QK_K))
        .zip(d.iter_mut())
        .zip(bsums.chunks_exact_mut(16))
        .zip(sums32.chunks_exact_mut(8))
    {
        *d = quantize_block(x, q, b, s);
    }
}

/// `m` rows of Q8_K activations: their quants in the file's order, one scale per
/// super-block, and the sums of each run of 16 and of 32 quants.
pub(crate) struct Q8K {
    pub(crate) qs: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) bsums: Vec<i16>,
    pub(crate) sums32: Vec<i16>,
}

/// `m` rows of `cols` values (a multiple of 256) in Q8_K.
pub(crate) fn quantize(x: &[f32], m: usize, cols: usize) -> Q8K {
    let sbs = cols / QK_K;
    let mut a = Q8K {
        qs: vec![0; m * sbs * QK_K],
        d: vec![0.0; m * sbs],
        bsums: vec![0; m * sbs * 16],
        sums32: vec![0; m * sbs * 8],
    };
    if m == 0 || sbs == 0 {
        return a;
    }
    let jobs = x
        .chunks_exact(cols)
        .take(m)
        .zip(a.qs.chunks_mut(sbs * QK_K))
        .zip(a.d.chunks_mut(sbs))
        .zip(a.bsums.chunks_mut(sbs * 16))
        .zip(a.sums32.chunks_mut(sbs * 8));
    if m >= PAR_MIN_ROWS {
        let jobs: Vec<_> = jobs.collect();
        jobs.into_par_iter()
            .for_each(|((((row, q), d), b), s)| quantize_row(row, q, d, b, s));
    } else {
        jobs.for_each(|((((row, q), d), b), s)| quantize_row(row, q, d, b, s));
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_k_scales_by_the_signed_maximum_and_keeps_sums() {
        let mut xs: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 100.0) * 0.01).collect();
        xs[7] = -3.0;
        let a = quantize(&xs, 1, QK_K);
        // The largest magnitude is negative: iscale = 127/3 > 0, so x = -3 → -127.
        assert_eq!(a.qs[7], -127);
        assert!((a.d[0] - 3.0 / 127.0).abs() < 1e-9);
        for (i, x) in xs.iter().enumerate() {
            assert!((f32::from(a.qs[i]) * a.d[0] - x).abs() <= a.d[0] * 0.5 + 1e-6);
        }
        let b0: i16 = a.qs[..16].iter().map(|v| i16::from(*v)).sum();
        assert_eq!(a.bsums[0], b0);
        assert_eq!(a.sums32[3], a.bsums[6] + a.bsums[7]);
        let zero = quantize(&[0.0; QK_K], 1, QK_K);
        assert_eq!(zero.d[0], 0.0);
        assert!(zero.qs.iter().all(|q| *q == 0));
    }
}
