//! Activation quantization, rounded as ggml's x86 SIMD code rounds (scale `d = amax/127`
//! stored as f16, multiplier `127/amax` in f32, round half to even), into the unit order
//! of [`crate::cpu::layout`]; Q8_K for the k-quants in [`crate::cpu::acts_k`].

use half::f16;
use rayon::prelude::*;

use crate::cpu::layout::{unit_position, WeightFormat, PAIR, QK, QK_K};
use crate::round::round_even_i32;

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// One block quantized: stored scale, `s` (Q8_1's `d * Σq`, rounded to f16) and quants.
#[cfg(test)]
fn quantize_block(xs: &[f32]) -> (f32, f32, [i8; QK]) {
    let mut q = [0i8; QK];
    let (d, s, _) = quantize_block_into(xs, |e, v| q[e] = v);
    (d, s, q)
}

/// Quantizes one block of [`QK`] values, handing quant `e` to `put(e, q)`; returns the
/// stored scale, `s` and the sum of the quants. Written as plain lane arithmetic so it
/// vectorizes.
#[inline(always)]
fn quantize_block_into(xs: &[f32], mut put: impl FnMut(usize, i8)) -> (f32, f32, i32) {
    let mut lanes = [0f32; 8];
    for c in xs.chunks_exact(8) {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l = l.max(x.abs());
        }
    }
    let amax = lanes.iter().fold(0f32, |m, x| m.max(*x));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut ints = [0i32; QK];
    for (q, x) in ints.iter_mut().zip(xs) {
        *q = round_even_i32(x * id);
    }
    let mut sum = 0i32;
    for (e, q) in ints.iter().enumerate() {
        sum += q;
        put(e, *q as i8);
    }
    // ggml multiplies by the unrounded scale, then rounds once.
    (round_f16(d), round_f16(d * sum as f32), sum)
}

/// `m` rows of activations quantized for one weight format: Q8_1 for Q4_1 weights,
/// Q8_0 for Q5_0 and Q8_0 weights, Q8_K for the k-quants.
#[derive(Debug, Clone)]
pub struct PackedActs {
    /// Activation rows.
    pub(crate) rows: usize,
    /// Pairs of blocks per row (super-blocks for Q8_K).
    pub(crate) pairs: usize,
    /// `pairs * 64` quants per row, in unit order (Q8_K: `pairs * 256`, in order).
    pub(crate) qs: Vec<i8>,
    /// Scales, `2 * pairs` per row (Q8_K: `pairs`).
    pub(crate) d: Vec<f32>,
    /// Q8_1 `s` per block (read for Q4_1 weights only).
    pub(crate) s: Vec<f32>,
    /// For Q8_0 and Q5_0 weights stored as `q + 128` and `q + 16`: per block, `-128 × Σ`
    /// (`-16 × Σ`) of its quants, the start value of a block's sum that makes it exact.
    pub(crate) block_corr: Vec<i32>,
    /// Q8_K: sums of each run of 16 quants, 16 per super-block.
    pub(crate) bsums: Vec<i16>,
    /// Q8_K: sums of each run of 32 quants, 8 per super-block.
    pub(crate) sums32: Vec<i16>,
}

/// Rows from which quantization is split over the thread pool.
const PAR_MIN_ROWS: usize = 4;

/// One activation row's slices of a [`PackedActs`]: quants, scales, `s`, and the block
/// corrections (empty when the weights need none).
type RowOut<'a> = (&'a mut [i8], &'a mut [f32], &'a mut [f32], &'a mut [i32]);

/// One activation row quantized into its slices; each block's correction is `-bias ×` the
/// sum of its quants.
fn quantize_row(row: &[f32], (qs, d, s, corr): RowOut<'_>, bias: i32) {
    for (b, block) in row.chunks_exact(QK).enumerate() {
        let unit = &mut qs[(b / 2) * PAIR..(b / 2 + 1) * PAIR];
        let k = b % 2;
        let (db, sb, sum) = quantize_block_into(block, |e, v| unit[unit_position(k, e)] = v);
        d[b] = db;
        s[b] = sb;
        if let Some(c) = corr.get_mut(b) {
            *c = -bias * sum;
        }
    }
}

impl PackedActs {
    /// Quantizes `m` rows of `cols` values (a multiple of 32); rows are independent, so
    /// a large batch is split over the current rayon pool.
    pub fn quantize(format: WeightFormat, x: &[f32], m: usize, cols: usize) -> Self {
        if format.is_k() {
            let k = crate::cpu::acts_k::quantize(x, m, cols);
            return PackedActs {
                rows: m,
                pairs: cols / QK_K,
                qs: k.qs,
                d: k.d,
                s: Vec::new(),
                block_corr: Vec::new(),
                bsums: k.bsums,
                sums32: k.sums32,
            };
        }
        let kb = cols / QK;
        let pairs = kb.div_ceil(2);
        // The bias of weights stored unsigned, which the block corrections take back.
        let bias = crate::cpu::layout_wide::bias(format);
        let mut a = Self {
            rows: m,
            pairs,
            qs: vec![0; m * pairs * PAIR],
            d: vec![0.0; m * 2 * pairs],
            s: vec![0.0; m * 2 * pairs],
            block_corr: vec![0; if bias != 0 { m * pairs * 2 } else { 0 }],
            bsums: Vec::new(),
            sums32: Vec::new(),
        };
        if m == 0 || pairs == 0 {
            return a;
        }
        let corr: Vec<&mut [i32]> = if bias != 0 {
            a.block_corr.chunks_mut(2 * pairs).collect()
        } else {
            (0..m).map(|_| Default::default()).collect()
        };
        let jobs = x
            .chunks_exact(cols)
            .take(m)
            .zip(a.qs.chunks_mut(pairs * PAIR))
            .zip(a.d.chunks_mut(2 * pairs))
            .zip(a.s.chunks_mut(2 * pairs))
            .zip(corr)
            .map(|((((row, qs), d), s), corr)| (row, (qs, d, s, corr)));
        if m >= PAR_MIN_ROWS {
            let jobs: Vec<_> = jobs.collect();
            jobs.into_par_iter()
                .for_each(|(row, out)| quantize_row(row, out, bias));
        } else {
            jobs.for_each(|(row, out)| quantize_row(row, out, bias));
        }
        a
    }

    /// Quant `i` (unit position) of pair `p` of row `t`.
    #[cfg(test)]
    pub(crate) fn quant(&self, t: usize, p: usize, i: usize) -> i32 {
        i32::from(self.qs[(t * self.pairs + p) * PAIR + i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::layout::unit_source;

    #[test]
    fn unit_position_inverts_unit_source() {
        for i in 0..PAIR {
            let (k, e) = unit_source(i);
            assert_eq!(unit_position(k, e), i);
        }
    }

    #[test]
    fn q8_1_keeps_values_within_half_a_step() {
        let xs: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.013)
            .collect();
        for (k, x) in xs.chunks(QK).enumerate() {
            let (d, s, q) = quantize_block(x);
            let sum: i32 = q.iter().map(|v| i32::from(*v)).sum();
            assert!(
                (s - d * sum as f32).abs() <= d.abs() * 2.0 + 1e-3,
                "block {k}"
            );
            for (q, v) in q.iter().zip(x) {
                assert!((f32::from(*q) * d - v).abs() <= d * 0.51, "{q} {v}");
            }
            assert_eq!(q.iter().map(|v| v.unsigned_abs()).max(), Some(127));
        }
    }

    #[test]
    fn fast_rounding_equals_round_ties_even() {
        let mut v = -130.0f32;
        while v <= 130.0 {
            assert_eq!(round_even_i32(v), v.round_ties_even() as i32, "{v}");
            v += 0.03125;
        }
        for v in [0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, -127.49999, 0.49999997] {
            assert_eq!(round_even_i32(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn ties_round_to_even_and_zero_blocks_stay_zero() {
        let mut xs = vec![0f32; QK];
        xs[0] = 127.0;
        xs[1] = 2.5;
        xs[2] = -3.5;
        let (_, _, q) = quantize_block(&xs);
        assert_eq!(&q[..3], &[127, 2, -4]);
        let (d, s, q) = quantize_block(&[0.0; QK]);
        assert_eq!((d, s), (0.0, 0.0));
        assert!(q.iter().all(|v| *v == 0));
    }

    #[test]
    fn unit_order_and_corrections_hold_every_value_once() {
        let xs: Vec<f32> = (0..3 * QK).map(|i| (i as f32 - 40.0) * 0.1).collect();
        let a = PackedActs::quantize(WeightFormat::Q8_0, &xs, 1, 3 * QK);
        assert_eq!(a.pairs, 2);
        for b in 0..3 {
            let (d, _, q) = quantize_block(&xs[b * QK..(b + 1) * QK]);
            assert_eq!(a.d[b], d);
            for (e, v) in q.iter().enumerate() {
                let i = (0..PAIR)
                    .find(|&i| unit_source(i) == (b % 2, e))
                    .unwrap_or(PAIR);
                assert_eq!(a.quant(0, b / 2, i), i32::from(*v), "block {b} elem {e}");
            }
        }
        // The padding block is zero, and every block's correction is -128 × its sum.
        assert_eq!(a.d[3], 0.0);
        for b in 0..3 {
            let (_, _, q) = quantize_block(&xs[b * QK..(b + 1) * QK]);
            let sum: i32 = q.iter().map(|v| i32::from(*v)).sum();
            assert_eq!(a.block_corr[b], -128 * sum, "block {b}");
        }
        assert_eq!(a.block_corr[3], 0);
        // Q5_0's: -16 × the sum; Q4_1's weights are unsigned, with no correction.
        let a5 = PackedActs::quantize(WeightFormat::Q5_0, &xs, 1, 3 * QK);
        let q4 = PackedActs::quantize(WeightFormat::Q4_1, &xs, 1, 3 * QK);
        assert_eq!(
            a5.block_corr[..3],
            a.block_corr[..3].iter().map(|c| c / 8).collect::<Vec<_>>()[..]
        );
        assert!(q4.block_corr.is_empty());
    }
}
