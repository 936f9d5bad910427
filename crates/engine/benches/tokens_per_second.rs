//! Engine-only speed on the default model: prefill of a 512-token prompt and decode of 128
//! tokens, at TP=1 and TP=2 on CPU ranks. Prints a markdown table.
//! Run: `cargo bench -p tessera-engine --bench tokens_per_second` (needs scripts/fetch-model).

use std::path::PathBuf;
use std::time::Instant;

use tessera_engine::{generate, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::SamplingParams;

fn model() -> PathBuf {
    tessera_engine::default_model_path()
}

fn main() {
    let prompt: Vec<u32> = (0..512).map(|i| 200 + (i * 37 % 9000) as u32).collect();
    println!("| TP | threads per rank | prefill 512 tokens | decode 128 tokens |");
    println!("| --- | --- | --- | --- |");
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // TP=2 with `cores` threads per rank oversubscribes the machine: measured to justify
    // the default of cores / ranks.
    for (tp, threads) in [(1, cores), (2, (cores / 2).max(1)), (2, cores)] {
        let mut cfg = EngineConfig::new(model()).with_cpu_ranks(tp);
        cfg.threads_per_rank = Some(threads);
        let mut engine = Engine::load(&cfg).expect("load");
        let mut run = |max_tokens: usize| {
            let opts = GenerateOptions {
                max_tokens,
                sampling: SamplingParams::greedy(),
                stop_token_ids: vec![],
                prefill_chunk: 0,
            };
            let start = Instant::now();
            generate(&mut engine, &prompt, &opts, |_| {}).expect("generate");
            start.elapsed().as_secs_f64()
        };
        run(1); // warm-up
        let prefill = (0..3).map(|_| run(1)).fold(f64::MAX, f64::min);
        let total = run(129);
        let decode = 128.0 / (total - prefill);
        println!(
            "| {tp} | {threads} | {:.0} tok/s ({:.0} ms) | {decode:.1} tok/s |",
            512.0 / prefill,
            prefill * 1e3
        );
    }
}
