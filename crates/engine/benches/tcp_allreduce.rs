//! All-reduce latency and bandwidth between two processes (`TcpComm` over loopback),
//! next to the same collective between two threads of one process (`LocalComm`), for
//! decode-sized (one token's hidden state) and prefill-sized (512 tokens) messages.
//! Prints a markdown table. Run: `cargo bench -p tessera-engine --bench tcp_allreduce`
//! (scripts/bench-nodes runs it). Rank 1 of each measurement is this same program,
//! started again with `TESSERA_BENCH_HUB` set.

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use tessera_engine::tp::{AllReduceDtype, Communicator, GroupToken, LocalComm, TcpEndpoint};

const TIMEOUT: Duration = Duration::from_secs(60);

fn iters(floats: usize) -> u32 {
    if floats > 100_000 {
        50
    } else {
        2000
    }
}

fn dtype_of(name: &str) -> AllReduceDtype {
    name.parse().expect("dtype")
}

/// Times `iters` all-reduces of `floats` values after a warm-up; the mean per call.
fn run(c: &mut dyn Communicator, floats: usize) -> Duration {
    let x = Tensor::ones(floats, candle_core::DType::F32, &Device::Cpu).expect("tensor");
    for _ in 0..10 {
        c.all_reduce_sum(&x).expect("warm-up");
    }
    let n = iters(floats);
    let start = Instant::now();
    for _ in 0..n {
        c.all_reduce_sum(&x).expect("all-reduce");
    }
    start.elapsed() / n
}

fn between_processes(floats: usize, dtype: &str) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let hub = listener.local_addr().expect("addr");
    let token = GroupToken::random();
    let mut peer = Command::new(std::env::current_exe().expect("this program"))
        .env("TESSERA_BENCH_HUB", hub.to_string())
        .env("TESSERA_BENCH_TOKEN", token.0.to_string())
        .env("TESSERA_BENCH_FLOATS", floats.to_string())
        .env("TESSERA_BENCH_DTYPE", dtype)
        .spawn()
        .expect("start rank 1");
    let mut comm = TcpEndpoint::hub(listener, 2, token, dtype_of(dtype), TIMEOUT)
        .open()
        .expect("rank 1 connects");
    let t = run(&mut comm, floats);
    assert!(peer.wait().expect("rank 1").success(), "rank 1 failed");
    t
}

fn between_threads(floats: usize, dtype: &str) -> Duration {
    let comms = LocalComm::group(2, dtype_of(dtype), TIMEOUT);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| s.spawn(move || run(&mut c, floats)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .max()
            .unwrap_or_default()
    })
}

/// Rank 1 of a measurement between processes.
fn peer(hub: &str) {
    let hub: SocketAddr = hub.parse().expect("hub address");
    let var = |k: &str| std::env::var(k).expect(k);
    let token = GroupToken(var("TESSERA_BENCH_TOKEN").parse().expect("token"));
    let floats: usize = var("TESSERA_BENCH_FLOATS").parse().expect("floats");
    let dtype = dtype_of(&var("TESSERA_BENCH_DTYPE"));
    let mut comm = TcpEndpoint::spoke(hub, 1, 2, token, dtype, TIMEOUT)
        .open()
        .expect("connect to rank 0");
    run(&mut comm, floats);
}

fn main() {
    if let Ok(hub) = std::env::var("TESSERA_BENCH_HUB") {
        return peer(&hub);
    }
    let hidden = 576;
    println!("| ranks | message | dtype | 2 processes (TCP, loopback) | 2 threads (in process) |");
    println!("| --- | --- | --- | --- | --- |");
    for (label, floats) in [
        ("decode: 1×576 f32 (2.3 KB)", hidden),
        ("prefill: 512×576 f32 (1.2 MB)", 512 * hidden),
    ] {
        for dtype in ["f32", "bf16"] {
            let cell = |t: Duration| {
                let gbs = (floats * 4) as f64 / t.as_secs_f64() / 1e9;
                format!("{:.1} µs, {gbs:.2} GB/s", t.as_secs_f64() * 1e6)
            };
            let tcp = between_processes(floats, dtype);
            let local = between_threads(floats, dtype);
            println!(
                "| 2 | {label} | {dtype} | {} | {} |",
                cell(tcp),
                cell(local)
            );
        }
    }
}
