//! The scheduler driving the GPU path (CPU ranks with the CUDA kernels emulated, see
//! `crates/engine/tests/gpu_emulated`), as `tessera serve` drives CUDA ranks: sixteen
//! requests at once — chunked prefills beside decodes, a shared prefix served from the
//! cache, preemption when blocks run out — each get the tokens they get alone, and every
//! KV block comes back; and greedy, sampled, log-probability and prompt-scoring requests
//! share steps (rows reduced on the device beside rows taken whole) without changing what
//! any of them streams.

mod common;

use std::path::PathBuf;

use common::engine_loop::{
    greedy_request, idle_metrics, run_concurrently, spawn_loop, stream_all, Streamed,
};
use tessera_engine::{test_models, Engine, EngineConfig};
use tessera_kernels::gpu::reference::Lcg;
use tessera_protocol::{GenerationRequest, SamplingParams, TokenLogprobs};
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

/// The model on emulated GPU ranks with a cache of `kv_cache_bytes`.
fn config(kv_cache_bytes: usize) -> EngineConfig {
    let mut cfg = EngineConfig::new(model());
    cfg.kv_cache_bytes = kv_cache_bytes;
    cfg.emulate_gpu = true;
    cfg
}

fn spawn(kv_cache_bytes: usize, max_batch_tokens: usize) -> SchedulerHandle {
    spawn_loop(&config(kv_cache_bytes), max_batch_tokens)
}

/// Each prompt's tokens, run alone.
fn each_alone(handle: &SchedulerHandle, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| run_concurrently(handle, std::slice::from_ref(p), MAX_TOKENS).remove(0))
        .collect()
}

#[test]
fn sixteen_concurrent_requests_on_the_gpu_path_equal_each_alone() {
    let prompts = prompts();
    let roomy = spawn(512 * BLOCK_BYTES, 2048);
    let alone = each_alone(&roomy, &prompts);
    let together = run_concurrently(&roomy, &prompts, MAX_TOKENS);
    assert_eq!(together, alone, "batching changed the tokens");
    let m = idle_metrics(&roomy);
    assert!(
        m.prefix_cache_hits_tokens > 0,
        "the shared prefix was not reused: {m:?}"
    );
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
    drop(roomy);

    // 8 blocks (128 tokens) cannot hold the sixteen sequences (about 700 tokens): the
    // newest are preempted and recomputed, in prefill chunks of at most 48 tokens.
    let tight = spawn(8 * BLOCK_BYTES, 48);
    let squeezed = run_concurrently(&tight, &prompts, MAX_TOKENS);
    let m = idle_metrics(&tight);
    assert!(m.preemptions_total >= 4, "expected preemptions: {m:?}");
    assert_eq!(squeezed, alone, "preemption changed the tokens");
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
}

/// The same sixteen requests with decode graphs (`EngineConfig::decode_graphs`; on an
/// emulated rank a replay runs the recorded step body from the graph's buffers, padded to
/// its bucket): each gets the tokens it gets alone without graphs, roomy and under
/// preemption, the decode steps were replayed, and every block comes back. The padding
/// rows' block is not the scheduler's: 9 blocks hold what 8 held without graphs.
#[test]
fn sixteen_concurrent_requests_replayed_from_graphs_equal_eager_ones() {
    let prompts = prompts();
    let alone = each_alone(&spawn(512 * BLOCK_BYTES, 2048), &prompts);
    for (blocks, max_batch_tokens, preempts) in [(512, 2048, false), (9, 48, true)] {
        let mut cfg = config(blocks * BLOCK_BYTES);
        cfg.decode_graphs = true;
        cfg.max_num_seqs = 16;
        let engine = Engine::load(&cfg).expect("engine");
        let stats = engine.stats();
        let sched = SchedulerConfig {
            max_batch_tokens,
            max_num_seqs: 16,
            ..SchedulerConfig::default()
        };
        let handle = EngineLoop::spawn(sched, engine).expect("engine loop");
        let together = run_concurrently(&handle, &prompts, MAX_TOKENS);
        assert_eq!(
            together, alone,
            "{blocks} blocks: graphs changed the tokens"
        );
        let m = idle_metrics(&handle);
        assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
        assert!(
            !preempts || m.preemptions_total >= 4,
            "expected preemptions: {m:?}"
        );
        let replayed = stats.snapshot()[0].graph_steps;
        assert!(replayed >= 5, "{blocks} blocks: {replayed} steps replayed");
    }
}

/// The largest difference between two lists of log-probabilities, which must name the
/// same tokens.
fn logprob_gap(a: &[Option<TokenLogprobs>], b: &[Option<TokenLogprobs>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => {
                let ids = |t: &TokenLogprobs| t.top.iter().map(|p| p.0).collect::<Vec<_>>();
                assert_eq!(ids(x), ids(y), "the alternatives differ");
                x.top
                    .iter()
                    .zip(&y.top)
                    .map(|(p, q)| (p.1 - q.1).abs())
                    .fold((x.logprob - y.logprob).abs(), f32::max)
            }
            (None, None) => 0.0,
            _ => panic!("log-probabilities on one side only"),
        })
        .fold(0.0, f32::max)
}

/// Greedy rows (reduced to their arg-max on the device), sampled rows (reduced to their
/// candidates), rows with log-probabilities and prompts being scored (taken whole) in the
/// same steps: each request streams what it streams alone.
#[test]
fn mixed_sampling_in_one_batch_on_the_gpu_path_equals_each_alone() {
    // This tied model's logits are peaked: high temperatures make the draws differ from
    // the greedy text.
    let sampled = |temperature: f32, seed: usize| SamplingParams {
        temperature,
        top_p: 0.95,
        seed: Some(seed as u64),
        ..SamplingParams::greedy()
    };
    let requests: Vec<GenerationRequest> = prompts()
        .into_iter()
        .skip(2)
        .take(10)
        .enumerate()
        .map(|(i, prompt)| {
            let mut r = greedy_request(&prompt, MAX_TOKENS);
            r.sampling = match i % 5 {
                0 => SamplingParams::greedy(),
                1 => sampled(3.0, i),
                2 => sampled(4.0, i),
                3 => SamplingParams {
                    logprobs: Some(2),
                    ..sampled(4.0, i)
                },
                _ => SamplingParams {
                    prompt_logprobs: Some(2),
                    logprobs: Some(1),
                    ..SamplingParams::greedy()
                },
            };
            r
        })
        .collect();
    let handle = spawn(512 * BLOCK_BYTES, 2048);
    let alone: Vec<Streamed> = requests
        .iter()
        .map(|r| stream_all(&handle, std::slice::from_ref(r)).remove(0))
        .collect();
    let together = stream_all(&handle, &requests);
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(t.0, a.0, "request {i}: tokens changed in the batch");
        // Batch sizes change matmul summation orders, and so a bf16 rounding here and
        // there: scores move by a little, tokens not at all.
        let gap = logprob_gap(&t.1, &a.1);
        assert!(gap < 2e-2, "request {i}: log-probabilities moved by {gap}");
        match (&a.2, &t.2) {
            (Some(pa), Some(pt)) => {
                assert_eq!(pa.len(), requests[i].prompt_ids.len() - 1, "request {i}");
                let wrap = |v: &Vec<TokenLogprobs>| v.iter().cloned().map(Some).collect::<Vec<_>>();
                let gap = logprob_gap(&wrap(pt), &wrap(pa));
                assert!(gap < 2e-2, "request {i}: prompt scores moved by {gap}");
            }
            (None, None) => assert!(requests[i].sampling.prompt_logprobs.is_none()),
            _ => panic!("request {i}: prompt scores on one side only"),
        }
    }
    // Sampled requests really sampled: not every one is its greedy text.
    let sampled_differ = [1, 2, 3, 6, 7, 8].iter().any(|i| {
        let mut r = requests[*i].clone();
        r.sampling = SamplingParams::greedy();
        stream_all(&handle, &[r]).remove(0).0 != alone[*i].0
    });
    assert!(sampled_differ, "sampling gave the greedy text every time");
    assert_eq!(idle_metrics(&handle).kv_blocks_in_use, 0);
}
