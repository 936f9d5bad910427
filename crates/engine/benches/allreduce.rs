//! All-reduce latency and bandwidth of `LocalComm` between CPU ranks, for decode-sized
//! (one token's hidden state) and prefill-sized (512 tokens) messages. Prints a markdown
//! table. Run: `cargo bench -p tessera-engine --bench allreduce`.

use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use tessera_engine::tp::{AllReduceDtype, Communicator, LocalComm};

fn bench(world: usize, floats: usize, dtype: AllReduceDtype) -> Duration {
    let iters = if floats > 100_000 { 50 } else { 2000 };
    let comms = LocalComm::group(world, dtype, Duration::from_secs(30));
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    let x = Tensor::ones(floats, candle_core::DType::F32, &Device::Cpu)
                        .expect("tensor");
                    for _ in 0..10 {
                        c.all_reduce_sum(&x).expect("warm-up");
                    }
                    let start = Instant::now();
                    for _ in 0..iters {
                        c.all_reduce_sum(&x).expect("all-reduce");
                    }
                    start.elapsed() / iters
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    times.into_iter().max().unwrap_or_default()
}

fn main() {
    let hidden = 576;
    println!("| ranks | message | dtype | latency | bandwidth (bytes reduced per rank / s) |");
    println!("| --- | --- | --- | --- | --- |");
    for world in [2, 3, 4] {
        for (label, floats) in [
            ("decode: 1×576 f32 (2.3 KB)", hidden),
            ("prefill: 512×576 f32 (1.2 MB)", 512 * hidden),
        ] {
            for dtype in [AllReduceDtype::F32, AllReduceDtype::Bf16] {
                let t = bench(world, floats, dtype);
                let gbs = (floats * 4) as f64 / t.as_secs_f64() / 1e9;
                println!(
                    "| {world} | {label} | {dtype:?} | {:.1} µs | {gbs:.2} GB/s |",
                    t.as_secs_f64() * 1e6
                );
            }
        }
    }
}
