//! The reference kernel: integer dot product per block, then `d_w·d_a·Σq_w q_a` (plus
//! `m_w·s_a` for Q4_1) summed in block order. For the k-quants, as ggml: per super-block an
//! exact integer `Σ_j sc_j Σ_{i∈j} q_i y_i` (Q6_K: with `q − 32`), scaled by `d_w·d_a`,
//! less `dmin·d_a·Σ_j m_j Σ_{i∈j} y_i` for Q4_K.

use crate::cpu::acts::PackedActs;
use crate::cpu::layout::{PackedWeights, WeightFormat, PAIR, QK_K};

/// Weight row `row` times activation row `t`.
pub fn dot(w: &PackedWeights, row: usize, a: &PackedActs, t: usize) -> f32 {
    if w.format.is_k() {
        return dot_k(w, row, a, t);
    }
    let pairs = w.pairs;
    let mut sum = 0f32;
    for p in 0..pairs {
        let aq = &a.qs[(t * pairs + p) * PAIR..][..PAIR];
        let mut isum = [0i32; 2];
        for (i, y) in aq.iter().enumerate() {
            isum[(i >> 2) & 1] += w.wide_quant(row, p, i) * i32::from(*y);
        }
        for (k, s) in isum.iter().enumerate() {
            let ab = t * 2 * pairs + 2 * p + k;
            sum += w.wide_scale(row, p, k) * a.d[ab] * *s as f32;
            if w.format == WeightFormat::Q4_1 {
                sum += w.wide_offset(row, p, k) * a.s[ab];
            }
        }
    }
    sum
}

/// Rows `r0..r0+R` times activation rows `t0..t0+T`, by activation row.
pub fn tile<const R: usize, const T: usize>(
    w: &PackedWeights,
    r0: usize,
    a: &PackedActs,
    t0: usize,
) -> [[f32; R]; T] {
    std::array::from_fn(|t| std::array::from_fn(|r| dot(w, r0 + r, a, t0 + t)))
}

/// [`dot`] for the k-quants.
fn dot_k(w: &PackedWeights, row: usize, a: &PackedActs, t: usize) -> f32 {
    let sbs = w.pairs;
    let mut sum = 0f32;
    for sb in 0..sbs {
        let y = &a.qs[(t * sbs + sb) * QK_K..][..QK_K];
        let dy = a.d[t * sbs + sb];
        let q4k = w.format == WeightFormat::Q4K;
        let sub = if q4k { 32 } else { 16 };
        let mut isum = 0i32;
        for (j, ys) in y.chunks_exact(sub).enumerate() {
            let bias = if q4k { 0 } else { 32 };
            let dot: i32 = ys
                .iter()
                .enumerate()
                .map(|(i, v)| (w.k_quant(row, sb, j * sub + i) - bias) * i32::from(*v))
                .sum();
            isum += w.k_scale(row, sb, j) * dot;
        }
        sum += w.k_d(row, sb) * dy * isum as f32;
        if q4k {
            let mins: i32 = (0..8)
                .map(|j| w.k_min(row, sb, j) * i32::from(a.sums32[(t * sbs + sb) * 8 + j]))
                .sum();
            sum -= w.k_dmin(row, sb) * dy * mins as f32;
        }
    }
    sum
}
