//! Activation quantization, rounded as ggml's x86 SIMD code rounds (scale `d = amax/127`
//! stored as f16, multiplier `127/amax` in f32, round half to even), into the unit order
//! of [`crate::cpu::layout`].

use half::f16;

use crate::cpu::layout::{unit_source, WeightFormat, PAIR, QK};

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Round half to even without a libm call: adding and subtracting 1.5·2²³ leaves the
/// nearest integer under the default rounding mode, exactly, for |v| < 2²².
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// One block quantized: stored scale, `s` (Q8_1's `d * Σq`, rounded to f16) and quants.
fn quantize_block(xs: &[f32]) -> (f32, f32, [i8; QK]) {
    let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [0i8; QK];
    let mut sum = 0i32;
    for (q, x) in q.iter_mut().zip(xs) {
        *q = round_even(x * id) as i8;
        sum += i32::from(*q);
    }
    // ggml multiplies by the unrounded scale, then rounds once.
    (round_f16(d), round_f16(d * sum as f32), q)
}

/// `m` rows of activations quantized for one weight format: Q8_1 for Q4_1 weights,
/// Q8_0 for Q8_0 weights.
#[derive(Debug, Clone)]
pub struct PackedActs {
    pub(crate) pairs: usize,
    /// `pairs * 64` quants per row, in unit order.
    pub(crate) qs: Vec<i8>,
    /// Scales, `2 * pairs` per row.
    pub(crate) d: Vec<f32>,
    /// Q8_1 `s` per block (Q4_1 weights only).
    pub(crate) s: Vec<f32>,
    /// For Q8_0 weights stored as `q + 128`: per pair, 16 lanes of `-128 × Σ` of the
    /// four activation quants each lane covers, the start value of a lane's sum that
    /// makes it exact.
    pub(crate) corr: Vec<i32>,
}

impl PackedActs {
    /// Quantizes `m` rows of `cols` values (a multiple of 32).
    pub fn quantize(format: WeightFormat, x: &[f32], m: usize, cols: usize) -> Self {
        let kb = cols / QK;
        let pairs = kb.div_ceil(2);
        let mut a = Self {
            pairs,
            qs: vec![0; m * pairs * PAIR],
            d: vec![0.0; m * 2 * pairs],
            s: vec![
                0.0;
                if format == WeightFormat::Q4_1 {
                    m * 2 * pairs
                } else {
                    0
                }
            ],
            corr: vec![
                0;
                if format == WeightFormat::Q8_0 {
                    m * pairs * 16
                } else {
                    0
                }
            ],
        };
        let mut q = [[0i8; QK]; 2];
        for (t, row) in x.chunks_exact(cols).take(m).enumerate() {
            for p in 0..pairs {
                for (k, qk) in q.iter_mut().enumerate() {
                    let b = 2 * p + k;
                    let at = t * 2 * pairs + b;
                    if b < kb {
                        let (d, s, vals) = quantize_block(&row[b * QK..(b + 1) * QK]);
                        a.d[at] = d;
                        if let Some(slot) = a.s.get_mut(at) {
                            *slot = s;
                        }
                        *qk = vals;
                    } else {
                        *qk = [0; QK];
                    }
                }
                let base = (t * pairs + p) * PAIR;
                for i in 0..PAIR {
                    let (k, e) = unit_source(i);
                    a.qs[base + i] = q[k][e];
                }
                if format == WeightFormat::Q8_0 {
                    for lane in 0..16 {
                        let sum: i32 = a.qs[base + 4 * lane..base + 4 * lane + 4]
                            .iter()
                            .map(|v| i32::from(*v))
                            .sum();
                        a.corr[(t * pairs + p) * 16 + lane] = -128 * sum;
                    }
                }
            }
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
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
            v += 0.03125;
        }
        for v in [0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, -127.49999, 0.49999997] {
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
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
        // The padding block is zero, and every lane's correction is -128 × its sum.
        assert_eq!(a.d[3], 0.0);
        let lane_sum: i32 = (4..8).map(|i| a.quant(0, 0, i)).sum();
        assert_eq!(a.corr[1], -128 * lane_sum);
    }
}
