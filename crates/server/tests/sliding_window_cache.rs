//! A model whose every layer attends to its last 8 positions (the tiny Mistral fixture,
//! `sliding_window` 8, as in Mistral 7B v0.1) served by the scheduler over the real
//! engine from a KV cache far smaller than the requests: blocks behind the window go back
//! to the pool, and every request still gets transformers' greedy text. The same on the
//! GPU path (the CUDA kernels emulated), whose attention must never read a block that
//! went back.

mod common;

use std::path::PathBuf;

use common::engine_loop::{idle_metrics, run_concurrently};
use common::reference::greedy_cases;
use tessera_engine::{generate, test_models, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::{Executor, SamplingParams};
use tessera_scheduler::{EngineLoop, SchedulerConfig};

const MAX_TOKENS: usize = 16;
const BLOCK: usize = 4;
/// Bytes of one block at TP = 1: 2 layers × (K + V) × 2 KV heads × 16 dims × 4 bytes × 4
/// tokens.
const BLOCK_BYTES: usize = 2 * 2 * 2 * 16 * 4 * BLOCK;

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/tiny-mistral")
}

fn engine(tp: usize, kv_cache_bytes: usize) -> Engine {
    let mut cfg = EngineConfig::new(model()).with_cpu_ranks(tp);
    cfg.block_size_tokens = BLOCK;
    cfg.kv_cache_bytes = kv_cache_bytes;
    Engine::load(&cfg).expect("engine")
}

/// Each prompt's greedy continuation on `engine`, one request at a time.
fn greedy_alone(engine: &mut Engine, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let opts = GenerateOptions {
        max_tokens: MAX_TOKENS,
        sampling: SamplingParams::greedy(),
        stop_token_ids: vec![],
        prefill_chunk: 0,
    };
    prompts
        .iter()
        .map(|p| generate(engine, p, &opts, |_| {}).expect("generate"))
        .collect()
}

/// Serves every prompt twice, all at once, from `small` (a windowed cache smaller than
/// the longest request) under the scheduler: they preempt one another as well. Each gets
/// its text `alone`, and every block comes back.
fn serve_twice_from(small: Engine, prompts: &[Vec<u32>], alone: &[Vec<u32>], what: &str) {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + MAX_TOKENS;
    let shape = small.kv_cache_shape();
    assert_eq!(shape.attention_window, Some(8), "{what}");
    assert!(shape.capacity_tokens() < longest, "{what}: {shape:?}");
    let handle = EngineLoop::spawn(
        SchedulerConfig {
            block_size_tokens: BLOCK,
            max_batch_tokens: 8,
            max_num_seqs: 4,
            ..SchedulerConfig::default()
        },
        small,
    )
    .expect("engine loop");
    let twice: Vec<Vec<u32>> = prompts.iter().chain(prompts).cloned().collect();
    let got = run_concurrently(&handle, &twice, MAX_TOKENS);
    for (i, (got, want)) in got.iter().zip(alone.iter().chain(alone)).enumerate() {
        assert_eq!(got, want, "{what}: request {i}");
    }
    let m = idle_metrics(&handle);
    assert_eq!(m.kv_blocks_in_use, 0, "{what}: blocks left held");
    handle.shutdown();
    handle.join().expect("loop");
}

#[test]
fn requests_longer_than_the_cache_get_the_greedy_text_of_a_roomy_cache() {
    let cases = greedy_cases(&model());
    let prompts: Vec<Vec<u32>> = cases.iter().map(|(p, _)| p.clone()).collect();
    let alone = greedy_alone(&mut engine(1, 64 << 20), &prompts);
    for ((_, want), got) in cases.iter().zip(&alone) {
        if let Some(want) = want {
            assert_eq!(got, want, "roomy cache against transformers");
        }
    }
    for tp in [1, 3] {
        // Six blocks of four tokens per rank at TP = 1 (more at TP = 3, whose ranks hold
        // fewer KV heads): far from the 76 tokens of the longest request.
        serve_twice_from(
            engine(tp, 6 * BLOCK_BYTES),
            &prompts,
            &alone,
            &format!("tp={tp}"),
        );
    }
}

/// The tiny Mistral architecture in a head dimension the CUDA kernels serve (64), with
/// random weights, written once under the target directory.
fn gpu_shaped_model() -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sliding-window-gpu-mistral");
    let dims = test_models::gpu_shaped("tiny-mistral").expect("dimensions");
    test_models::write(&model(), &out, &dims, 20261127).expect("random model");
    out
}

#[test]
fn the_gpu_path_releases_blocks_behind_the_window_and_gives_the_same_text() {
    let path = gpu_shaped_model();
    let gpu_path = |kv_cache_bytes: usize| {
        let mut cfg = EngineConfig::new(&path);
        cfg.emulate_gpu = true;
        cfg.block_size_tokens = BLOCK;
        cfg.kv_cache_bytes = kv_cache_bytes;
        Engine::load(&cfg).expect("engine")
    };
    let prompts: Vec<Vec<u32>> = greedy_cases(&model()).into_iter().map(|(p, _)| p).collect();
    let alone = greedy_alone(&mut gpu_path(64 << 20), &prompts);
    // Two layers × (K + V) × 2 KV heads × 64 dims × bf16 × 4 tokens: eight blocks, far
    // from the longest request.
    serve_twice_from(
        gpu_path(8 * 2 * 2 * 2 * 64 * 2 * BLOCK),
        &prompts,
        &alone,
        "gpu path",
    );
}
