//! Engine-only speed on the default model: prefill of a 512-token prompt and decode of 128
//! tokens, at TP=1 and TP=2 on CPU ranks. Prints a markdown table.
//! Run: `cargo bench -p tessera-engine --bench tokens_per_second` (needs scripts/fetch-model).
//!
//! Environment (used by scripts/bench to compare with llama.cpp on the same prompt):
//! - `TESSERA_BENCH_PROMPT_FILE`: a text file whose first 512 tokens (Tessera's own
//!   tokenizer) are the prompt, instead of synthetic token ids;
//! - `TESSERA_BENCH_TP1_ONLY=1`: only the TP=1 row;
//! - `TESSERA_BENCH_JSON`: also write the rows as JSON to this file;
//! - `TESSERA_BENCH_MODEL`: another GGUF file instead of the default model (for
//!   Gemma 3 270M: `~/.cache/tessera/models/gemma-3-270m-q4_k_m.gguf`).

use std::path::PathBuf;
use std::time::Instant;

use tessera_engine::{generate, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::SamplingParams;

fn model() -> PathBuf {
    std::env::var_os("TESSERA_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(tessera_engine::default_model_path)
}

fn prompt() -> Vec<u32> {
    let Ok(file) = std::env::var("TESSERA_BENCH_PROMPT_FILE") else {
        return (0..512).map(|i| 200 + (i * 37 % 9000) as u32).collect();
    };
    let text = std::fs::read_to_string(&file).expect("read TESSERA_BENCH_PROMPT_FILE");
    let tokenizer = tessera_engine::load_tokenizer(&model()).expect("tokenizer");
    let ids = tokenizer.encode(&text, false).expect("encode");
    assert!(
        ids.len() >= 512,
        "{file} has {} tokens, need 512",
        ids.len()
    );
    ids[..512].to_vec()
}

fn main() {
    let prompt = prompt();
    let tp1_only = std::env::var("TESSERA_BENCH_TP1_ONLY").is_ok_and(|v| v == "1");
    let mut rows = Vec::new();
    println!("| TP | threads per rank | prefill 512 tokens | decode 128 tokens |");
    println!("| --- | --- | --- | --- |");
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // TP=2 with `cores` threads per rank oversubscribes the machine: measured to justify
    // the default of cores / ranks.
    let configs = [(1, cores), (2, (cores / 2).max(1)), (2, cores)];
    let configs = if tp1_only {
        &configs[..1]
    } else {
        &configs[..]
    };
    for &(tp, threads) in configs {
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
        rows.push(serde_json::json!({
            "tp": tp,
            "threads_per_rank": threads,
            "prompt_tokens": prompt.len(),
            "decode_tokens": 128,
            "prefill_ms": prefill * 1e3,
            "prefill_tok_s": 512.0 / prefill,
            "decode_tok_s": decode,
        }));
    }
    if let Ok(path) = std::env::var("TESSERA_BENCH_JSON") {
        let json = serde_json::to_string_pretty(&rows).expect("json");
        std::fs::write(&path, json).expect("write TESSERA_BENCH_JSON");
    }
}
