//! The scheduler driving the GPU path (CPU ranks with the CUDA kernels emulated, see
//! `crates/engine/tests/gpu_emulated`), as `tessera serve` drives CUDA ranks: sixteen
//! requests at once — chunked prefills beside decodes, a shared prefix served from the
//! cache, preemption when blocks run out — each get the tokens they get alone, and every
//! KV block comes back.

mod common;

use std::path::PathBuf;

use common::engine_loop::{idle_metrics, run_concurrently};
use tessera_engine::{test_models, Engine, EngineConfig};
use tessera_kernels::gpu::reference::Lcg;
use tessera_scheduler::{EngineLoop, SchedulerConfig, SchedulerHandle};

const MAX_TOKENS: usize = 10;
/// Bytes of one KV block on the GPU path: K and V, 2 layers, 2 KV heads of 64, bf16, 16
/// tokens.
const BLOCK_BYTES: usize = 2 * 2 * 2 * 64 * 2 * 16;

fn model() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-path-scheduling-llama");
    let dims = test_models::gpu_shaped("tiny-llama").expect("dimensions");
    test_models::write(
        &root.join("tests/fixtures/models/tiny-llama"),
        &out,
        &dims,
        20261124,
    )
    .expect("random model");
    out
}

/// Sixteen random prompts of 1 to 70 tokens; two share a prefix of 40.
fn prompts() -> Vec<Vec<u32>> {
    let mut rng = Lcg(3);
    let mut token = |_| rng.below(512) as u32;
    let mut out: Vec<Vec<u32>> = (0..14)
        .map(|i| (0..1 + (i * 37) % 70).map(&mut token).collect())
        .collect();
    let shared: Vec<u32> = (0..40).map(&mut token).collect();
    for tail in [5, 9] {
        let mut p = shared.clone();
        p.extend((0..tail).map(&mut token));
        out.push(p);
    }
    out
}

fn spawn(kv_cache_bytes: usize, max_batch_tokens: usize) -> SchedulerHandle {
    let mut cfg = EngineConfig::new(model());
    cfg.kv_cache_bytes = kv_cache_bytes;
    cfg.emulate_gpu = true;
    let engine = Engine::load(&cfg).expect("engine");
    let sched = SchedulerConfig {
        max_batch_tokens,
        max_num_seqs: 16,
        ..SchedulerConfig::default()
    };
    EngineLoop::spawn(sched, engine).expect("engine loop")
}

#[test]
fn sixteen_concurrent_requests_on_the_gpu_path_equal_each_alone() {
    let prompts = prompts();
    let roomy = spawn(512 * BLOCK_BYTES, 2048);
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| run_concurrently(&roomy, std::slice::from_ref(p), MAX_TOKENS).remove(0))
        .collect();
    let together = run_concurrently(&roomy, &prompts, MAX_TOKENS);
    assert_eq!(together, alone, "batching changed the tokens");
    let m = idle_metrics(&roomy);
    assert!(
        m.prefix_cache_hits_tokens > 0,
        "the shared prefix was not reused: {m:?}"
    );
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
    drop(roomy);

    // 16 blocks (256 tokens) cannot hold the sixteen sequences (about 700 tokens): the
    // newest are preempted and recomputed, in prefill chunks of at most 48 tokens.
    let tight = spawn(16 * BLOCK_BYTES, 48);
    let squeezed = run_concurrently(&tight, &prompts, MAX_TOKENS);
    let m = idle_metrics(&tight);
    assert!(m.preemptions_total >= 4, "expected preemptions: {m:?}");
    assert_eq!(squeezed, alone, "preemption changed the tokens");
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
}
