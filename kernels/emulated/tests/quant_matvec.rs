//! The quantized decode kernels (`cuda/quant_matvec.cu`) on the emulated grid, for every
//! GGUF type they take and 1 to 8 rows:
//! - the host reference dequantizes ggml's blocks exactly as candle does (bit for bit),
//!   so the reference's layouts are ggml's;
//! - the kernels equal the reference with the same int8 activations up to f32 rounding,
//!   `|y - y_q8| <= 1e-6 · Σ|w·x|` (measured: under 1e-7): a wrong nibble order, bit or scale moves outputs by
//!   far more (shown by the last test);
//! - against the exact f32 product the kernels stay within the bound int8 activations
//!   allow (`q8_error_bound`), and their error is printed beside candle's CPU QMatMul's.

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use tessera_kernels::gpu::quant_matvec::{GgufQuant, MAX_ROWS};
use tessera_kernels::gpu::quant_reference::{
    abs_products, dequantize, matvec_f64, matvec_q8_f64, q8_error_bound,
};
use tessera_kernels_emulated::quant_matvec::{quant_matvec, Activations};

/// Relative f32 rounding allowed against the f64 product with the same int8 activations.
const ROUNDING: f64 = 1e-6;

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn ggml(q: GgufQuant) -> GgmlDType {
    match q {
        GgufQuant::Q4_0 => GgmlDType::Q4_0,
        GgufQuant::Q4_1 => GgmlDType::Q4_1,
        GgufQuant::Q8_0 => GgmlDType::Q8_0,
        GgufQuant::Q4K => GgmlDType::Q4K,
        GgufQuant::Q5K => GgmlDType::Q5K,
        GgufQuant::Q6K => GgmlDType::Q6K,
    }
}

/// `n × k` weights of random bytes: every quant, high bit and packed scale random, the
/// f16 scales in ranges that keep the weights near 1.
fn random_blocks(q: GgufQuant, n: usize, k: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..q.weight_bytes(n, k)).map(|_| rng.random()).collect();
    let mut set = |b: &mut [u8], at: usize, lo: f32, hi: f32| {
        b[at..at + 2].copy_from_slice(&f16::from_f32(rng.random_range(lo..hi)).to_le_bytes());
    };
    for b in bytes.chunks_exact_mut(q.block_bytes()) {
        match q {
            GgufQuant::Q4_0 | GgufQuant::Q8_0 => set(b, 0, 0.001, 0.05),
            GgufQuant::Q4_1 => {
                set(b, 0, 0.001, 0.05);
                set(b, 2, -0.4, 0.0);
            }
            GgufQuant::Q4K | GgufQuant::Q5K => {
                set(b, 0, 0.0001, 0.005);
                set(b, 2, 0.0, 0.01);
            }
            GgufQuant::Q6K => set(b, 208, 0.0001, 0.002),
        }
    }
    bytes
}

fn random_values(len: usize, rng: &mut impl Rng) -> Vec<f32> {
    // A sum of uniforms: roughly normal, with some large values.
    (0..len)
        .map(|_| (0..3).map(|_| rng.random_range(-1.0f32..1.0)).sum())
        .collect()
}

fn candle_weights(q: GgufQuant, bytes: &[u8], n: usize, k: usize) -> QTensor {
    qtensor_from_ggml(ggml(q), bytes, vec![n, k], &Device::Cpu).expect("candle reads the blocks")
}

#[test]
fn the_reference_dequantizes_as_candle_does() {
    let mut rng = rng(7);
    for q in GgufQuant::ALL {
        let (n, k) = (3, 512);
        let bytes = random_blocks(q, n, k, &mut rng);
        let theirs = candle_weights(q, &bytes, n, k)
            .dequantize(&Device::Cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("candle dequantizes");
        let ours = dequantize(q, &bytes, n, k).expect("dequantize");
        let same = ours
            .iter()
            .zip(&theirs)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same && ours.len() == n * k,
            "{q:?}: dequantized weights differ"
        );
    }
}

/// Largest `|y - want| / scale` over the outputs.
fn worst(y: &[f32], want: &[f64], scale: &[f64]) -> f64 {
    y.iter()
        .zip(want)
        .zip(scale)
        .map(|((y, w), s)| (f64::from(*y) - w).abs() / s.max(1e-30))
        .fold(0.0, f64::max)
}

#[test]
fn the_kernels_equal_the_reference_for_1_to_8_rows() {
    let mut rng = rng(11);
    for q in GgufQuant::ALL {
        let b = q.block_elems();
        // Columns that leave a block's warps partly idle; rows of fewer units than lanes
        // and of more (lanes take a second unit).
        for (n, k) in [(37, b * 3), (6, 32 * 40)] {
            let bytes = random_blocks(q, n, k, &mut rng);
            let w = dequantize(q, &bytes, n, k).expect("dequantize");
            let (mut worst_q8, mut worst_exact) = (0f64, 0f64);
            for rows in 1..=MAX_ROWS {
                let mut x = random_values(rows * k, &mut rng);
                // A block of zeros quantizes to zeros with scale 0.
                x[..32].fill(0.0);
                // Odd row counts run on bf16 activations, as rounded to bf16.
                let xb: Vec<bf16> = x.iter().map(|v| bf16::from_f32(*v)).collect();
                let acts = if rows % 2 == 1 {
                    x = xb.iter().map(|v| v.to_f32()).collect();
                    Activations::Bf16(&xb)
                } else {
                    Activations::F32(&x)
                };
                let y = quant_matvec(q, &bytes, acts, n, k).expect("launch");
                let tol: Vec<f64> = abs_products(&w, &x, n, k)
                    .iter()
                    .map(|s| s * ROUNDING)
                    .collect();
                worst_q8 = worst_q8.max(worst(&y, &matvec_q8_f64(&w, &x, n, k), &tol));
                let allowed: Vec<f64> = q8_error_bound(&w, &x, n, k)
                    .iter()
                    .zip(&tol)
                    .map(|(b, t)| b + t)
                    .collect();
                worst_exact = worst_exact.max(worst(&y, &matvec_f64(&w, &x, n, k), &allowed));
            }
            println!(
                "{q:?} n={n} k={k}: |y - y_q8| / ({ROUNDING:e} Σ|wx|) <= {worst_q8:.3}, \
                 |y - y_exact| / bound <= {worst_exact:.3}"
            );
            assert!(worst_q8 <= 1.0, "{q:?} n={n} k={k}: off the int8 reference");
            assert!(worst_exact <= 1.0, "{q:?} n={n} k={k}: past the int8 bound");
        }
    }
}

/// Root of the summed squares of `a - b`, over that of `b`.
fn relative_rms(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = b.iter().map(|b| b * b).sum();
    (num / den).sqrt()
}

#[test]
fn int8_activations_cost_about_what_candle_costs() {
    let mut rng = rng(13);
    let (rows, n, k) = (4, 48, 1024);
    for q in GgufQuant::ALL {
        let wf = random_values(n * k, &mut rng);
        let qt = Tensor::from_slice(&wf, (n, k), &Device::Cpu)
            .and_then(|t| QTensor::quantize(&t, ggml(q)))
            .expect("candle quantizes");
        let bytes = qt.data().expect("blocks").to_vec();
        let w = dequantize(q, &bytes, n, k).expect("dequantize");
        let x = random_values(rows * k, &mut rng);
        let exact = matvec_f64(&w, &x, n, k);
        let ours: Vec<f64> = quant_matvec(q, &bytes, Activations::F32(&x), n, k)
            .expect("launch")
            .iter()
            .map(|v| f64::from(*v))
            .collect();
        let theirs: Vec<f64> = QMatMul::from_qtensor(qt)
            .and_then(|m| m.forward(&Tensor::from_slice(&x, (rows, k), &Device::Cpu)?))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("candle's QMatMul")
            .iter()
            .map(|v| f64::from(*v))
            .collect();
        let (e_ours, e_candle) = (relative_rms(&ours, &exact), relative_rms(&theirs, &exact));
        println!(
            "{q:?}: relative RMS error against the exact product: ours {e_ours:.2e}, \
             candle CPU {e_candle:.2e}, ours against candle {:.2e}",
            relative_rms(&ours, &theirs)
        );
        // Per-32 int8 activations: about 0.3% for normal data (a step of amax / 127
        // over values of RMS ~amax / 3), and no worse than candle's 8-bit activations
        // by more than chance.
        assert!(e_ours < 1e-2, "{q:?}: {e_ours}");
        assert!(
            e_ours < 1.5 * e_candle + 1e-6,
            "{q:?}: {e_ours} vs {e_candle}"
        );
    }
}

#[test]
fn the_check_sees_a_wrong_nibble_order_or_scale() {
    let mut rng = rng(17);
    for q in GgufQuant::ALL {
        let (n, k) = (8, q.block_elems() * 2);
        let bytes = random_blocks(q, n, k, &mut rng);
        let w = dequantize(q, &bytes, n, k).expect("dequantize");
        let x = random_values(2 * k, &mut rng);
        let y = quant_matvec(q, &bytes, Activations::F32(&x), n, k).expect("launch");
        let tol: Vec<f64> = abs_products(&w, &x, n, k)
            .iter()
            .map(|s| s * ROUNDING)
            .collect();
        // The halves of every 32 weights swapped (low and high nibbles of Q4_0/Q4_1
        // exchanged), and the second 16 of every 32 at twice their scale (Q6_K's
        // scale index off by one).
        let swapped: Vec<f32> = w
            .chunks_exact(32)
            .flat_map(|c| c[16..].iter().chain(&c[..16]).copied().collect::<Vec<_>>())
            .collect();
        let scaled: Vec<f32> = w
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 32 >= 16 { 2.0 * v } else { *v })
            .collect();
        for wrong in [swapped, scaled] {
            let off = worst(&y, &matvec_q8_f64(&wrong, &x, n, k), &tol);
            assert!(
                off > 100.0,
                "{q:?}: a wrong layout came within {off} of the bound"
            );
        }
    }
}
