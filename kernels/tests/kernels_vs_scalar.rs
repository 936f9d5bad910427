//! Every SIMD kernel against its scalar reference on random data, and the quantized
//! matmul against a float matmul of the dequantized weights.

use rand::{Rng, SeedableRng};
use tessera_kernels::cpu::dot::{
    dot_q4_1_q8_1, dot_q4_1_q8_1_scalar, dot_q8_0_q8_0, dot_q8_0_q8_0_scalar, isa,
};
use tessera_kernels::cpu::quantize::{quantize_row_q8_0, quantize_row_q8_1};
use tessera_kernels::{BlockQ4_1, BlockQ8_0, BlockQ8_1, QuantWeights, WeightFormat, QK};

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(42)
}

fn random_q4_1(rng: &mut impl Rng, n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n {
        bytes.extend(half::f16::from_f32(rng.random_range(0.001..0.05)).to_le_bytes());
        bytes.extend(half::f16::from_f32(rng.random_range(-0.4..0.0)).to_le_bytes());
        bytes.extend((0..QK / 2).map(|_| rng.random::<u8>()));
    }
    bytes
}

fn random_q8_0(rng: &mut impl Rng, n: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..n {
        bytes.extend(half::f16::from_f32(rng.random_range(0.001..0.05)).to_le_bytes());
        bytes.extend((0..QK).map(|_| rng.random_range(-127i8..=127) as u8));
    }
    bytes
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn simd_dot_products_equal_the_scalar_reference() {
    let mut r = rng();
    println!("kernels use {:?}", isa());
    for blocks in [1, 2, 7, 18, 48] {
        let x = BlockQ4_1::parse(&random_q4_1(&mut r, blocks));
        let acts: Vec<f32> = (0..blocks * QK)
            .map(|_| r.random_range(-3.0..3.0))
            .collect();
        let mut y = vec![BlockQ8_1::default(); blocks];
        quantize_row_q8_1(&acts, &mut y);
        let (a, b) = (dot_q4_1_q8_1(isa(), &x, &y), dot_q4_1_q8_1_scalar(&x, &y));
        assert!(close(a, b), "q4_1 {blocks} blocks: {a} vs {b}");

        let x = BlockQ8_0::parse(&random_q8_0(&mut r, blocks));
        let mut y = vec![BlockQ8_0::default(); blocks];
        quantize_row_q8_0(&acts, &mut y);
        let (a, b) = (dot_q8_0_q8_0(isa(), &x, &y), dot_q8_0_q8_0_scalar(&x, &y));
        assert!(close(a, b), "q8_0 {blocks} blocks: {a} vs {b}");
    }
}

#[test]
fn quantized_matmul_is_close_to_the_float_product() {
    let mut r = rng();
    let (rows, cols) = (37, 128);
    for format in [WeightFormat::Q4_1, WeightFormat::Q8_0] {
        let bytes = match format {
            WeightFormat::Q4_1 => random_q4_1(&mut r, rows * cols / QK),
            WeightFormat::Q8_0 => random_q8_0(&mut r, rows * cols / QK),
        };
        let w = QuantWeights::from_ggml_bytes(format, rows, cols, &bytes).expect("weights");
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
    assert!(QuantWeights::from_ggml_bytes(WeightFormat::Q4_1, 2, 30, &[]).is_err());
}

#[test]
fn four_rows_at_once_equal_one_at_a_time_bit_for_bit() {
    use tessera_kernels::cpu::dot::WeightBlock;
    let mut r = rng();
    let blocks = 18;
    let acts: Vec<f32> = (0..blocks * QK)
        .map(|_| r.random_range(-3.0..3.0))
        .collect();
    let rows: Vec<Vec<BlockQ4_1>> = (0..4)
        .map(|_| BlockQ4_1::parse(&random_q4_1(&mut r, blocks)))
        .collect();
    let mut y = vec![BlockQ8_1::default(); blocks];
    quantize_row_q8_1(&acts, &mut y);
    let four = BlockQ4_1::dot4(isa(), [&rows[0], &rows[1], &rows[2], &rows[3]], &y);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            four[i].to_bits(),
            BlockQ4_1::dot(isa(), row, &y).to_bits(),
            "q4_1 row {i}"
        );
    }
    let rows: Vec<Vec<BlockQ8_0>> = (0..4)
        .map(|_| BlockQ8_0::parse(&random_q8_0(&mut r, blocks)))
        .collect();
    let mut y = vec![BlockQ8_0::default(); blocks];
    quantize_row_q8_0(&acts, &mut y);
    let four = BlockQ8_0::dot4(isa(), [&rows[0], &rows[1], &rows[2], &rows[3]], &y);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            four[i].to_bits(),
            BlockQ8_0::dot(isa(), row, &y).to_bits(),
            "q8_0 row {i}"
        );
    }
}
