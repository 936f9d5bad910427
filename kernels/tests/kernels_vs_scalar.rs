//! Every SIMD kernel against the scalar reference on random data, batch invariance of
//! each implementation, and the quantized matmul against a float matmul of the
//! dequantized weights.

use rand::{Rng, SeedableRng};
use tessera_kernels::{Isa, QuantWeights, WeightFormat, QK, QK_K};

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(42)
}

/// GGUF bytes of `n` random blocks (super-blocks for the k-quants).
fn random_blocks(rng: &mut impl Rng, format: WeightFormat, n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    let f16 = |rng: &mut dyn FnMut() -> f32| half::f16::from_f32(rng()).to_le_bytes();
    for _ in 0..n {
        match format {
            // Every byte of quants, high bits and packed scales random.
            WeightFormat::Q4K => {
                bytes.extend(f16(&mut || rng.random_range(0.0001..0.005)));
                bytes.extend(f16(&mut || rng.random_range(0.0..0.01)));
                bytes.extend((0..12 + QK_K / 2).map(|_| rng.random::<u8>()));
                continue;
            }
            WeightFormat::Q6K => {
                bytes.extend((0..QK_K / 2 + QK_K / 4 + QK_K / 16).map(|_| rng.random::<u8>()));
                bytes.extend(f16(&mut || rng.random_range(0.0001..0.002)));
                continue;
            }
            _ => {}
        }
        bytes.extend(half::f16::from_f32(rng.random_range(0.001..0.05)).to_le_bytes());
        match format {
            WeightFormat::Q5_0 => bytes.extend((0..4 + QK / 2).map(|_| rng.random::<u8>())),
            WeightFormat::Q4K | WeightFormat::Q6K => {}
            WeightFormat::Q4_1 => {
                bytes.extend(half::f16::from_f32(rng.random_range(-0.4..0.0)).to_le_bytes());
                bytes.extend((0..QK / 2).map(|_| rng.random::<u8>()));
            }
            // The whole byte range, -128 included, which ggml never writes but a file may.
            WeightFormat::Q8_0 => bytes.extend((0..QK).map(|_| rng.random::<u8>())),
        }
    }
    bytes
}

fn random_matrix(
    rng: &mut impl Rng,
    format: WeightFormat,
    rows: usize,
    cols: usize,
) -> QuantWeights {
    let bytes = random_blocks(rng, format, rows * cols / format.block_values());
    QuantWeights::from_ggml_bytes(format, rows, cols, &bytes).expect("weights")
}

const FORMATS: [WeightFormat; 5] = [
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q8_0,
    WeightFormat::Q4K,
    WeightFormat::Q6K,
];

/// Widths to try for a format: every one a whole number of its blocks.
fn widths(format: WeightFormat, pair_widths: &[usize]) -> Vec<usize> {
    if format.is_k() {
        vec![QK_K, 3 * QK_K, 2048]
    } else {
        pair_widths.to_vec()
    }
}

#[test]
fn every_implementation_equals_the_scalar_reference() {
    let mut r = rng();
    let isas = Isa::supported();
    println!("kernels on this CPU: {isas:?}");
    // Odd block counts exercise the zero padding block; 37 rows and 9 tokens the tails.
    for format in FORMATS {
        for cols in widths(format, &[32, 96, 288, 576, 1536]) {
            let w = random_matrix(&mut r, format, 37, cols);
            let wf = w.dequantize();
            for m in [1, 4, 9] {
                let x: Vec<f32> = (0..m * cols).map(|_| r.random_range(-3.0..3.0)).collect();
                let reference = w.matmul_with(Isa::Scalar, &x, m);
                for &isa in isas {
                    let got = w.matmul_with(isa, &x, m);
                    for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
                        let (t, o) = (i / 37, i % 37);
                        // Only the order of f32 additions differs: bound by the size of
                        // the terms.
                        let terms: f32 = (0..cols)
                            .map(|k| (x[t * cols + k] * wf[o * cols + k]).abs())
                            .sum();
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + terms),
                            "{isa:?} {format:?} cols {cols} m {m} [{t}, {o}]: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
    let mut r = rng();
    // Batches of 1 to 17 rows: every mix of the 8-, 4-, 2- and 1-row tiles, and a second
    // full tile.
    let most = 17;
    for format in FORMATS {
        let (rows, cols) = (23, if format.is_k() { 2 * QK_K } else { 192 });
        let w = random_matrix(&mut r, format, rows, cols);
        let x: Vec<f32> = (0..most * cols)
            .map(|_| r.random_range(-2.0..2.0))
            .collect();
        for &isa in Isa::supported() {
            let alone: Vec<Vec<f32>> = (0..most)
                .map(|t| w.matmul_with(isa, &x[t * cols..(t + 1) * cols], 1))
                .collect();
            for m in 1..=most {
                let batch = w.matmul_with(isa, &x[..m * cols], m);
                for (t, alone) in alone[..m].iter().enumerate() {
                    for o in 0..rows {
                        assert_eq!(
                            batch[t * rows + o].to_bits(),
                            alone[o].to_bits(),
                            "{isa:?} {format:?} batch {m} token {t} row {o}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn quantized_matmul_is_close_to_the_float_product() {
    let mut r = rng();
    for format in FORMATS {
        let (rows, cols) = (37, if format.is_k() { QK_K } else { 128 });
        let w = random_matrix(&mut r, format, rows, cols);
        let wf = w.dequantize();
        for m in [1, 3] {
            let x: Vec<f32> = (0..m * cols).map(|_| r.random_range(-1.0..1.0)).collect();
            let y = w.matmul(&x, m);
            for t in 0..m {
                for o in 0..rows {
                    let exact: f32 = (0..cols).map(|k| x[t * cols + k] * wf[o * cols + k]).sum();
                    let got = y[t * rows + o];
                    // Activation quantization error: at most half a step per value.
                    let bound: f32 =
                        (0..cols).map(|k| wf[o * cols + k].abs()).sum::<f32>() * 1.0 / 127.0 + 1e-3;
                    assert!(
                        (got - exact).abs() <= bound,
                        "{format:?} m={m} row {o}: {got} vs {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn dequantize_reads_the_file_layout_back() {
    // One Q4_1 block: d = 0.5, m = -1, quants 0..16 then 15..0.
    let mut bytes = Vec::new();
    bytes.extend(half::f16::from_f32(0.5).to_le_bytes());
    bytes.extend(half::f16::from_f32(-1.0).to_le_bytes());
    bytes.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let w = QuantWeights::from_ggml_bytes(WeightFormat::Q4_1, 1, 32, &bytes).expect("q4_1");
    let expected: Vec<f32> = (0..16)
        .map(|j| 0.5 * j as f32 - 1.0)
        .chain((0..16).map(|j| 0.5 * (15 - j) as f32 - 1.0))
        .collect();
    assert_eq!(w.dequantize(), expected);
    // One Q8_0 block: d = 0.25, quants -16..16.
    let mut bytes = half::f16::from_f32(0.25).to_le_bytes().to_vec();
    bytes.extend((-16i8..16).map(|q| q as u8));
    let w = QuantWeights::from_ggml_bytes(WeightFormat::Q8_0, 1, 32, &bytes).expect("q8_0");
    let expected: Vec<f32> = (-16..16).map(|q| 0.25 * q as f32).collect();
    assert_eq!(w.dequantize(), expected);
}

#[test]
fn dequantize_reads_q5_0_and_the_k_quants_back() {
    // Q5_0: d = 0.5, fifth bits set on values 0 and 17; nibbles j | (15 - j) << 4.
    let mut bytes = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    bytes.extend(((1u32 << 0) | (1u32 << 17)).to_le_bytes());
    bytes.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let w = QuantWeights::from_ggml_bytes(WeightFormat::Q5_0, 1, 32, &bytes).expect("q5_0");
    let got = w.dequantize();
    assert_eq!(got[0], 0.5 * (16 - 16) as f32);
    assert_eq!(got[1], 0.5 * (1 - 16) as f32);
    assert_eq!(got[16], 0.5 * (15 - 16) as f32);
    assert_eq!(got[17], 0.5 * (14 + 16 - 16) as f32);
    // Q4_K: d = 1, dmin = 0.5; sub-block 5 (j >= 4) scale 33 = 1 | 2 << 4 and min 18 =
    // 2 | 1 << 4 split over the 12 bytes; quant byte 32·2 + 3 = 0x7A.
    let mut b = vec![0u8; 144];
    b[0..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
    b[2..4].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
    let s = &mut b[4..16];
    s[9] = 1 | (2 << 4); // scale low bits, min low bits of sub-block 5
    s[1] = 2 << 6; // scale high bits of sub-block 5
    s[5] = 1 << 6; // min high bits of sub-block 5
    b[16 + 64 + 3] = 0x7A;
    let w = QuantWeights::from_ggml_bytes(WeightFormat::Q4K, 1, QK_K, &b).expect("q4_k");
    let got = w.dequantize();
    // Value 160 + 3 is the high nibble (7) of that byte, in sub-block 5.
    assert_eq!(got[163], 33.0 * 7.0 - 0.5 * 18.0);
    // Value 128 + 3, the low nibble (10), is sub-block 4: scale and min 0.
    assert_eq!(got[131], 0.0);
    // Q6_K: d = 0.25; value 128 + 64 + 5 is the high nibble of ql[64 + 5] and bits 4-5
    // of qh[32 + 5]; sub-block 12 has scale -3.
    let mut b = vec![0u8; 210];
    b[64 + 5] = 0x90;
    b[128 + 32 + 5] = 0b10 << 4;
    b[192 + 12] = (-3i8) as u8;
    b[208..210].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
    let w = QuantWeights::from_ggml_bytes(WeightFormat::Q6K, 1, QK_K, &b).expect("q6_k");
    let got = w.dequantize();
    assert_eq!(got[197], 0.25 * -3.0 * ((9 | (2 << 4)) - 32) as f32);
    // Value 5 (sub-block 0, scale 0) stays 0.
    assert_eq!(got[5], 0.0);
}

#[test]
fn shapes_that_do_not_fit_are_refused() {
    assert!(QuantWeights::from_ggml_bytes(WeightFormat::Q4K, 1, 128, &[0; 72]).is_err());
    assert!(QuantWeights::from_ggml_bytes(WeightFormat::Q6K, 1, 256, &[0; 209]).is_err());
    assert!(QuantWeights::from_ggml_bytes(WeightFormat::Q4_1, 2, 30, &[]).is_err());
    assert!(QuantWeights::from_ggml_bytes(WeightFormat::Q8_0, 2, 32, &[0; 33]).is_err());
}

/// ggml's dequantization of one file block (super-block for the k-quants), written from
/// the format definitions, independently of the crate's layouts.
fn decode_block(format: WeightFormat, b: &[u8]) -> Vec<f32> {
    let f16 = |at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    match format {
        WeightFormat::Q4_1 => (0..QK)
            .map(|e| {
                let byte = b[4 + e % 16];
                let q = if e < 16 { byte & 15 } else { byte >> 4 };
                f16(0) * f32::from(q) + f16(2)
            })
            .collect(),
        WeightFormat::Q5_0 => (0..QK)
            .map(|e| {
                let byte = b[6 + e % 16];
                let low = if e < 16 { byte & 15 } else { byte >> 4 };
                let high = (u32::from_le_bytes([b[2], b[3], b[4], b[5]]) >> e) & 1;
                f16(0) * ((u32::from(low) | (high << 4)) as f32 - 16.0)
            })
            .collect(),
        WeightFormat::Q8_0 => (0..QK)
            .map(|e| f16(0) * f32::from(b[2 + e] as i8))
            .collect(),
        WeightFormat::Q4K => {
            let s = &b[4..16];
            let sm = |j: usize| {
                if j < 4 {
                    (s[j] & 63, s[j + 4] & 63)
                } else {
                    (
                        (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
                        (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                    )
                }
            };
            (0..QK_K)
                .map(|v| {
                    let byte = b[16 + 32 * (v / 64) + v % 32];
                    let q = if (v / 32) % 2 == 0 {
                        byte & 15
                    } else {
                        byte >> 4
                    };
                    let (sc, m) = sm(v / 32);
                    f16(0) * f32::from(sc) * f32::from(q) - f16(2) * f32::from(m)
                })
                .collect()
        }
        WeightFormat::Q6K => (0..QK_K)
            .map(|v| {
                let (n, l) = (v / 128, v % 32);
                let k = (v % 128) / 32;
                let low = b[64 * n + l + 32 * (k % 2)];
                let low = if k < 2 { low & 15 } else { low >> 4 };
                let high = (b[128 + 32 * n + l] >> (2 * k)) & 3;
                let q = i32::from(low | (high << 4)) - 32;
                f16(208) * f32::from(b[192 + v / 16] as i8) * q as f32
            })
            .collect(),
    }
}

#[test]
fn every_format_keeps_each_value_of_each_row_in_place() {
    // Rows past a group of sixteen and, for the 32-value formats, an odd block count, so
    // the packing's padding rows and padding block are crossed too.
    let mut r = rng();
    for format in FORMATS {
        let (rows, cols) = (37, if format.is_k() { 3 * QK_K } else { 7 * QK });
        let blocks = rows * cols / format.block_values();
        let bytes = random_blocks(&mut r, format, blocks);
        let w = QuantWeights::from_ggml_bytes(format, rows, cols, &bytes).expect("weights");
        let want: Vec<f32> = bytes
            .chunks_exact(format.file_bytes())
            .flat_map(|b| decode_block(format, b))
            .collect();
        let got = w.dequantize();
        for (i, (g, v)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - v).abs() <= 1e-6 * v.abs().max(1.0),
                "{format:?} row {} col {}: {g} vs {v}",
                i / cols,
                i % cols
            );
        }
    }
}
