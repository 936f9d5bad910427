//! Activation quantization, rounded as ggml's x86 SIMD code rounds: scale `d = amax/127`
//! stored as f16, multiplier `127/amax` in f32, round half to even.

use half::f16;

use crate::cpu::blocks::{BlockQ8_0, BlockQ8_1, QK};

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Returns (stored scale, multiplier) for one block.
fn scales(xs: &[f32]) -> (f32, f32) {
    let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (round_f16(d), id)
}

/// Round half to even without a libm call: adding and subtracting 1.5·2²³ leaves the
/// nearest integer under the default rounding mode, exactly, for |v| < 2²².
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

fn quantize_into(xs: &[f32], id: f32, qs: &mut [i8; QK]) -> i32 {
    let mut sum = 0i32;
    for (q, x) in qs.iter_mut().zip(xs) {
        *q = round_even(x * id) as i8;
        sum += i32::from(*q);
    }
    sum
}

/// Quantizes one row (a multiple of 32 values) to Q8_1.
pub fn quantize_row_q8_1(xs: &[f32], out: &mut [BlockQ8_1]) {
    for (block, x) in out.iter_mut().zip(xs.chunks_exact(QK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let (stored, id) = scales(x);
        let sum = quantize_into(x, id, &mut block.qs);
        block.d = stored;
        // ggml multiplies by the unrounded scale, then rounds once.
        block.s = round_f16(d * sum as f32);
    }
}

/// Quantizes one row (a multiple of 32 values) to Q8_0.
pub fn quantize_row_q8_0(xs: &[f32], out: &mut [BlockQ8_0]) {
    for (block, x) in out.iter_mut().zip(xs.chunks_exact(QK)) {
        let (stored, id) = scales(x);
        quantize_into(x, id, &mut block.qs);
        block.d = stored;
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
        let mut out = vec![BlockQ8_1::default(); 2];
        quantize_row_q8_1(&xs, &mut out);
        for (b, x) in out.iter().zip(xs.chunks(QK)) {
            let sum: i32 = b.qs.iter().map(|q| i32::from(*q)).sum();
            assert!((b.s - b.d * sum as f32).abs() <= b.d.abs() * 2.0 + 1e-3);
            for (q, v) in b.qs.iter().zip(x) {
                assert!((f32::from(*q) * b.d - v).abs() <= b.d * 0.51, "{q} {v}");
            }
            assert_eq!(b.qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
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
        let mut out = vec![BlockQ8_0::default()];
        quantize_row_q8_0(&xs, &mut out);
        assert_eq!(&out[0].qs[..3], &[127, 2, -4]);
        let mut z = vec![BlockQ8_0::default()];
        quantize_row_q8_0(&[0.0; QK], &mut z);
        assert_eq!(z[0].d, 0.0);
        assert!(z[0].qs.iter().all(|q| *q == 0));
    }
}
