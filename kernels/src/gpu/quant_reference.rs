//! The plain host reference of the quantized matrix-vector kernels
//! ([`super::quant_matvec`]): ggml's blocks dequantized to f32 (as ggml and candle do it,
//! bit for bit), products in f64, and the bound on what quantizing the activations to
//! int8 may cost.

use half::f16;

use super::quant_matvec::{quantize_rows, GgufQuant, Q8_BLOCK};
use crate::cpu::layout_k::scale_min;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// One block's weights, appended to `out`.
fn dequantize_block(quant: GgufQuant, b: &[u8], out: &mut Vec<f32>) {
    match quant {
        GgufQuant::Q4_0 | GgufQuant::Q4_1 => {
            let d = f16_at(b, 0);
            let (m, qs) = match quant {
                GgufQuant::Q4_1 => (Some(f16_at(b, 2)), &b[4..20]),
                _ => (None, &b[2..18]),
            };
            for half in [0, 4] {
                out.extend(qs.iter().map(|q| {
                    let v = (q >> half) & 0xf;
                    match m {
                        Some(m) => f32::from(v) * d + m,
                        None => f32::from(i16::from(v) - 8) * d,
                    }
                }));
            }
        }
        GgufQuant::Q8_0 => {
            let d = f16_at(b, 0);
            out.extend(b[2..34].iter().map(|q| f32::from(*q as i8) * d));
        }
        GgufQuant::Q4K | GgufQuant::Q5K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = match quant {
                GgufQuant::Q5K => (Some(&b[16..48]), &b[48..176]),
                _ => (None, &b[16..144]),
            };
            for j in 0..8 {
                let (sc, m) = scale_min(scales, j);
                let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
                let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                for (l, q) in q.iter().enumerate() {
                    let low = (q >> (4 * (j % 2))) & 0xf;
                    let high = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
                    out.push(d1 * f32::from(low | high) - m1);
                }
            }
        }
        GgufQuant::Q6K => {
            let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            for j in 0..8 {
                let (h, t) = (j / 4, j % 4);
                for l in 0..32 {
                    let low = (ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 0xf;
                    let high = ((qh[32 * h + l] >> (2 * t)) & 3) << 4;
                    let q = i16::from(low | high) - 32;
                    let s = sc[8 * h + 2 * t + l / 16] as i8;
                    out.push(d * f32::from(s) * f32::from(q));
                }
            }
        }
    }
}

/// An `n × k` weight of ggml blocks as f32, row-major.
pub fn dequantize(quant: GgufQuant, bytes: &[u8], n: usize, k: usize) -> Result<Vec<f32>, String> {
    if !k.is_multiple_of(quant.block_elems()) || bytes.len() != quant.weight_bytes(n, k) {
        return Err(format!(
            "{} bytes are not {n} x {k} weights of {quant:?}",
            bytes.len()
        ));
    }
    let mut out = Vec::with_capacity(n * k);
    for b in bytes.chunks_exact(quant.block_bytes()) {
        dequantize_block(quant, b, &mut out);
    }
    Ok(out)
}

/// `x[rows, k] · w[n, k]ᵀ` in f64.
pub fn matvec_f64(w: &[f32], x: &[f32], n: usize, k: usize) -> Vec<f64> {
    let rows = x.len() / k.max(1);
    let mut y = vec![0f64; rows * n];
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            let wc = &w[c * k..(c + 1) * k];
            y[r * n + c] = wc
                .iter()
                .zip(xr)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
        }
    }
    y
}

/// What the kernels compute, in f64: the product with each row of `x` quantized to int8
/// blocks as `quantize_q8_act_*` does. The kernels differ from this only by f32
/// rounding.
pub fn matvec_q8_f64(w: &[f32], x: &[f32], n: usize, k: usize) -> Vec<f64> {
    let xq: Vec<f32> = quantize_rows(x, k)
        .iter()
        .flat_map(|a| a.dequantize())
        .collect();
    matvec_f64(w, &xq, n, k)
}

/// For each output, a bound on what int8 activations cost against the exact product:
/// each activation moves by at most half its block's step `d = amax / 127`, so
/// `|y_q8 - y| <= Σ_blocks d / 2 · Σ_{i in block} |w_i|`.
pub fn q8_error_bound(w: &[f32], x: &[f32], n: usize, k: usize) -> Vec<f64> {
    let rows = x.len() / k.max(1);
    let acts = quantize_rows(x, k);
    let blocks = k / Q8_BLOCK;
    let mut bound = vec![0f64; rows * n];
    for r in 0..rows {
        for c in 0..n {
            bound[r * n + c] = (0..blocks)
                .map(|b| {
                    let half_step = f64::from(acts[r * blocks + b].d) / 2.0;
                    let wb = &w[c * k + b * Q8_BLOCK..c * k + (b + 1) * Q8_BLOCK];
                    half_step * wb.iter().map(|v| f64::from(v.abs())).sum::<f64>()
                })
                .sum();
        }
    }
    bound
}

/// For each output, `Σ |w_i · x_i|`: the scale against which f32 rounding is measured.
pub fn abs_products(w: &[f32], x: &[f32], n: usize, k: usize) -> Vec<f64> {
    let ax: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let aw: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    matvec_f64(&aw, &ax, n, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_nibbles_low_half_first() {
        // d = 1, byte i = (15 - i) << 4 | i: weights i - 8, then (15 - i) - 8.
        let mut b = f16::from_f32(1.0).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|i| ((15 - i) << 4) | i));
        let w = dequantize(GgufQuant::Q4_0, &b, 1, 32).unwrap_or_default();
        let want: Vec<f32> = (0..16)
            .chain((0..16).rev())
            .map(|v| v as f32 - 8.0)
            .collect();
        assert_eq!(w, want);
    }

    #[test]
    fn the_bound_holds_on_a_product() {
        let k = 64;
        let w: Vec<f32> = (0..2 * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let x: Vec<f32> = (0..k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        let exact = matvec_f64(&w, &x, 2, k);
        let q8 = matvec_q8_f64(&w, &x, 2, k);
        let bound = q8_error_bound(&w, &x, 2, k);
        for c in 0..2 {
            assert!((exact[c] - q8[c]).abs() <= bound[c]);
            assert!(bound[c] > 0.0);
        }
    }
}
