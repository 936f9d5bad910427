//! Continuous batching on the default model, engine + scheduler (no HTTP):
//! - aggregate output tokens/s for 1, 4, 16 and 64 concurrent requests, against the same
//!   requests run one by one;
//! - time to first token of a request whose 500-token prefix is in the prefix cache,
//!   against the same request with a cold cache.
//!
//! Prints markdown tables. Run: `cargo bench -p tessera-server --bench batching`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{GenerationRequest, SamplingParams, StopCondition, TokenEvent};
use tessera_scheduler::{EngineLoop, SchedulerConfig, SchedulerHandle};

const OUTPUT_TOKENS: usize = 32;

fn model() -> PathBuf {
    tessera_engine::default_model_path()
}

fn spawn(enable_prefix_caching: bool) -> SchedulerHandle {
    let mut cfg = EngineConfig::new(model());
    cfg.kv_cache_bytes = 512 << 20;
    let engine = Engine::load(&cfg).expect("engine");
    let sched = SchedulerConfig {
        max_num_seqs: 64,
        max_batch_tokens: 2048,
        enable_prefix_caching,
        ..SchedulerConfig::default()
    };
    EngineLoop::spawn(sched, engine).expect("engine loop")
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt_ids: prompt,
        sampling: SamplingParams::greedy(),
        stop: StopCondition {
            max_tokens,
            stop_token_ids: vec![],
            ignore_eos: true,
            request_stop_token_ids: Vec::new(),
        },
        cache_salt: None,
    }
}

/// A distinct ~64-token prompt per request.
fn prompt(i: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| 300 + ((i * 7919 + j * 104_729) % 20_000) as u32)
        .collect()
}

/// Submits all requests at once; returns (wall time, time to first token of each).
fn run(
    handle: &SchedulerHandle,
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
) -> (Duration, Vec<Duration>) {
    let start = Instant::now();
    let receivers: Vec<_> = prompts
        .into_iter()
        .map(|p| handle.submit(request(p, max_tokens)).expect("admitted").1)
        .collect();
    let ttfts = std::thread::scope(|s| {
        let joins: Vec<_> = receivers
            .into_iter()
            .map(|mut rx| {
                s.spawn(move || {
                    let mut first = None;
                    while let Some(ev) = rx.blocking_recv() {
                        match ev {
                            TokenEvent::Token { .. } => {
                                first.get_or_insert_with(|| start.elapsed());
                            }
                            TokenEvent::Finished { .. } => break,
                            TokenEvent::Error(e)
                            | TokenEvent::Failed(e)
                            | TokenEvent::Refused(e) => {
                                panic!("{e}")
                            }
                            TokenEvent::Embedding(_) => panic!("an embedding for a generation"),
                        }
                    }
                    first.unwrap_or_default()
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("receiver"))
            .collect()
    });
    (start.elapsed(), ttfts)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let handle = spawn(false);
    run(&handle, vec![prompt(999, 64)], 4); // warm-up
    println!("| concurrent requests | batched: output tok/s | one by one: output tok/s | speed-up | median TTFT (batched) |");
    println!("| --- | --- | --- | --- | --- |");
    for n in [1, 4, 16, 64] {
        let prompts: Vec<Vec<u32>> = (0..n).map(|i| prompt(i, 64)).collect();
        let (batched, ttfts) = run(&handle, prompts.clone(), OUTPUT_TOKENS);
        let sequential: Duration = prompts
            .into_iter()
            .map(|p| run(&handle, vec![p], OUTPUT_TOKENS).0)
            .sum();
        let tokens = (n * OUTPUT_TOKENS) as f64;
        println!(
            "| {n} | {:.1} | {:.1} | {:.2}× | {:.0} ms |",
            tokens / batched.as_secs_f64(),
            tokens / sequential.as_secs_f64(),
            sequential.as_secs_f64() / batched.as_secs_f64(),
            median(ttfts).as_secs_f64() * 1e3
        );
    }
    drop(handle);

    println!();
    println!("| 500-token shared prefix | time to first token |");
    println!("| --- | --- |");
    let handle = spawn(true);
    let prefix = prompt(4242, 496);
    let with_suffix = |i: usize| {
        let mut p = prefix.clone();
        p.extend(prompt(i, 8));
        p
    };
    let cold = run(&handle, vec![with_suffix(1)], 1).1[0];
    let warm = median(
        (2..7)
            .map(|i| run(&handle, vec![with_suffix(i)], 1).1[0])
            .collect(),
    );
    println!(
        "| uncached (cold cache) | {:.0} ms |",
        cold.as_secs_f64() * 1e3
    );
    println!(
        "| cached prefix, new 8-token suffix (median of 5) | {:.0} ms |",
        warm.as_secs_f64() * 1e3
    );
    let m = handle.metrics();
    println!();
    println!(
        "prefix cache: {} of {} looked-up prompt tokens hit",
        m.prefix_cache_hits_tokens, m.prefix_cache_queries_tokens
    );
}
