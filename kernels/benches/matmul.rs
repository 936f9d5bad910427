//! Q4_1, Q5_0, Q8_0, Q4_K and Q6_K matmul throughput on one thread, for every kernel
//! implementation this
//! CPU runs: weight bytes (as stored in the GGUF file) streamed per second for decode
//! (1 token), small decode batches and speculative verification (2, 4, 5 and 8 tokens),
//! a decode batch (16 tokens) and a prefill chunk (128 tokens).
//! Run: `cargo bench -p tessera-kernels --bench matmul`.

use std::time::Instant;

use tessera_kernels::{Isa, QuantWeights, WeightFormat};

fn weight_bytes(format: WeightFormat, rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut state = 12345u32;
    let mut next = || {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
        (state >> 16) as u8
    };
    let d = half::f16::from_f32(0.01).to_le_bytes();
    for _ in 0..rows * cols / format.block_values() {
        match format {
            WeightFormat::Q4_1 => {
                bytes.extend(d);
                bytes.extend(half::f16::from_f32(-0.1).to_le_bytes());
                bytes.extend((0..16).map(|_| next()));
            }
            WeightFormat::Q5_0 => {
                bytes.extend(d);
                bytes.extend((0..20).map(|_| next()));
            }
            WeightFormat::Q8_0 => {
                bytes.extend(d);
                bytes.extend((0..32).map(|_| next() % 255));
            }
            WeightFormat::Q4K => {
                bytes.extend(d);
                bytes.extend(d);
                bytes.extend((0..140).map(|_| next()));
            }
            WeightFormat::Q6K => {
                bytes.extend((0..208).map(|_| next()));
                bytes.extend(d);
            }
        }
    }
    bytes
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    println!("| matrix (1 thread) | kernels | tokens | time per call | weight GB/s | GMAC/s |");
    println!("| --- | --- | --- | --- | --- | --- |");
    // The FFN gate/up shape of SmolLM2-135M (Q4_1) and a slice of its tied LM head (Q8_0);
    // Gemma 3 270M Q4_K_M's FFN gate/up (Q5_0), attention output (Q4_K) and FFN down
    // (Q6_K).
    for (format, rows, cols) in [
        (WeightFormat::Q4_1, 1536, 576),
        (WeightFormat::Q8_0, 4096, 576),
        (WeightFormat::Q5_0, 2048, 640),
        (WeightFormat::Q4K, 640, 1024),
        (WeightFormat::Q6K, 640, 2048),
    ] {
        let bytes = weight_bytes(format, rows, cols);
        let w = QuantWeights::from_ggml_bytes(format, rows, cols, &bytes).expect("weights");
        for &isa in Isa::supported() {
            for m in [1usize, 2, 4, 5, 8, 16, 128] {
                let x: Vec<f32> = (0..m * cols)
                    .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                    .collect();
                let iters = (if isa == Isa::Scalar { 100 } else { 2000 } / m).max(3);
                let t = pool.install(|| {
                    std::hint::black_box(w.matmul_with(isa, &x, m));
                    let start = Instant::now();
                    for _ in 0..iters {
                        std::hint::black_box(w.matmul_with(isa, &x, m));
                    }
                    start.elapsed().as_secs_f64() / iters as f64
                });
                println!(
                    "| {format:?} {rows}×{cols} | {isa:?} | {m} | {:.1} µs | {:.1} | {:.1} |",
                    t * 1e6,
                    bytes.len() as f64 / t / 1e9,
                    (rows * cols * m) as f64 / t / 1e9
                );
            }
        }
    }
}
