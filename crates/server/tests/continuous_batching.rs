//! The scheduler driving the real engine: batching, chunked prefill, prefix caching and
//! preemption change no token of any request.

mod common;

use common::engine_loop::{idle_metrics, run_concurrently, spawn_loop, test_model as model};
use tessera_engine::{load_tokenizer, EngineConfig};
use tessera_scheduler::SchedulerHandle;

const MAX_TOKENS: usize = 12;

/// Sixteen prompts of different lengths; two share a long prefix.
fn prompts() -> Vec<Vec<u32>> {
    let tok = load_tokenizer(&model()).expect("tokenizer");
    let shared = "You are a careful assistant. Answer briefly and precisely, in plain English, \
                  without lists or headings. ";
    let texts = [
        "The three primary colors are",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea,",
        "The capital of Japan is",
        "List three fruits:",
        "import numpy as np\nx = np.",
        "The quick brown fox",
        "Water boils at",
        "In 1969, the first",
        "My favourite programming language is",
        "A haiku about autumn:\n",
        "The square root of 144 is",
        "Paris is famous for",
        "Rust is a language that",
    ];
    let mut out: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode(t, true).expect("encode"))
        .collect();
    out.push(
        tok.encode(&format!("{shared}What is 2+2?"), true)
            .expect("encode"),
    );
    out.push(
        tok.encode(&format!("{shared}Name a planet."), true)
            .expect("encode"),
    );
    out
}

fn spawn(kv_cache_bytes: usize, max_batch_tokens: usize) -> SchedulerHandle {
    let mut cfg = EngineConfig::new(model());
    cfg.kv_cache_bytes = kv_cache_bytes;
    spawn_loop(&cfg, max_batch_tokens)
}

#[test]
fn sixteen_concurrent_requests_equal_each_alone_even_under_preemption() {
    let prompts = prompts();
    // Alone: one request at a time through a roomy cache.
    let roomy = spawn(64 << 20, 2048);
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| run_concurrently(&roomy, std::slice::from_ref(p), MAX_TOKENS).remove(0))
        .collect();
    for t in &alone {
        assert_eq!(t.len(), MAX_TOKENS);
    }
    // Together: every step mixes prefills and decodes; the shared prefix is cached.
    let together = run_concurrently(&roomy, &prompts, MAX_TOKENS);
    assert_eq!(together, alone, "batching changed the tokens");
    let m = idle_metrics(&roomy);
    assert!(
        m.prefix_cache_hits_tokens > 0,
        "the shared prefix was not reused: {m:?}"
    );
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
    drop(roomy);

    // A cache of 16 blocks (256 tokens) cannot hold all 16 sequences (about 330 tokens in
    // at least 32 blocks): the newest are preempted and recomputed; small prefill chunks
    // on top.
    let block_bytes = 2 * 30 * 3 * 64 * 4 * 16;
    let tight = spawn(16 * block_bytes, 64);
    let squeezed = run_concurrently(&tight, &prompts, MAX_TOKENS);
    let m = idle_metrics(&tight);
    println!("tight cache: {m:?}");
    assert!(m.preemptions_total >= 4, "expected preemptions: {m:?}");
    assert_eq!(squeezed, alone, "preemption changed the tokens");
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
}
