//! The reference kernel: integer dot product per block, then `d_w·d_a·Σq_w q_a` (plus
//! `m_w·s_a` for Q4_1) summed in block order.

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, WeightFormat, PAIR};

/// Weight row `row` times activation row `t`.
pub fn dot(w: &PackedWeights, row: usize, a: &PackedActs, t: usize) -> f32 {
    let pairs = w.pairs;
    let mut sum = 0f32;
    for p in 0..pairs {
        let aq = &a.qs[(t * pairs + p) * PAIR..][..PAIR];
        let mut isum = [0i32; 2];
        for (i, y) in aq.iter().enumerate() {
            isum[(i >> 2) & 1] += w.quant(row, p, i) * i32::from(*y);
        }
        for (k, s) in isum.iter().enumerate() {
            let (b, ab) = (2 * p + k, t * 2 * pairs + 2 * p + k);
            sum += w.scale(row, p, k) * a.d[ab] * *s as f32;
            if w.format == WeightFormat::Q4_1 {
                sum += w.offset(row, b) * a.s[ab];
            }
        }
    }
    sum
}

/// Rows `r0..r0+R` times activation rows `t0..t0+T`.
pub fn tile<const R: usize, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; T]; R] {
    std::array::from_fn(|r| std::array::from_fn(|t| dot(w, r0 + r, a, t0 + t)))
}
