//! Q4_1 and Q8_0 matmul throughput on one thread: weight bytes streamed per second for
//! decode (1 token) and a small batch (16 tokens), and the one-row-at-a-time dot product
//! against the four-row kernel. Run: `cargo bench -p tessera-kernels --bench matmul`.

use std::time::Instant;

use tessera_kernels::cpu::dot::{isa, WeightBlock};
use tessera_kernels::{BlockQ4_1, BlockQ8_1, QuantWeights, WeightFormat, QK};

fn q4_1_bytes(rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut state = 12345u32;
    for _ in 0..rows * cols / QK {
        bytes.extend(half::f16::from_f32(0.01).to_le_bytes());
        bytes.extend(half::f16::from_f32(-0.1).to_le_bytes());
        for _ in 0..QK / 2 {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
            bytes.push((state >> 16) as u8);
        }
    }
    bytes
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let (rows, cols) = (1536, 576);
    let bytes = q4_1_bytes(rows, cols);
    let w = QuantWeights::from_ggml_bytes(WeightFormat::Q4_1, rows, cols, &bytes).expect("weights");
    let file_bytes = bytes.len() as f64;
    println!("kernels: {:?}", isa());
    println!("| Q4_1 {rows}×{cols}, 1 thread | time per call | weight GB/s |");
    println!("| --- | --- | --- |");
    for m in [1usize, 16] {
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let iters = 2000 / m;
        let t = pool.install(|| {
            let start = Instant::now();
            for _ in 0..iters {
                std::hint::black_box(w.matmul(&x, m));
            }
            start.elapsed().as_secs_f64() / iters as f64
        });
        println!(
            "| four-row kernel, m={m} | {:.1} µs | {:.1} |",
            t * 1e6,
            file_bytes / t / 1e9
        );
    }
    // The single-row dot product over the same data, for comparison.
    let blocks = BlockQ4_1::parse(&bytes);
    let kb = cols / QK;
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let mut xq = vec![BlockQ8_1::default(); kb];
    BlockQ4_1::quantize_row(&x, &mut xq);
    let iters = 2000;
    let start = Instant::now();
    for _ in 0..iters {
        for r in 0..rows {
            std::hint::black_box(BlockQ4_1::dot(isa(), &blocks[r * kb..(r + 1) * kb], &xq));
        }
    }
    let t = start.elapsed().as_secs_f64() / iters as f64;
    println!(
        "| one row at a time, m=1 | {:.1} µs | {:.1} |",
        t * 1e6,
        file_bytes / t / 1e9
    );
}
