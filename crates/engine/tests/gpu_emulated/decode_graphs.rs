//! Decode steps replayed from graphs (`EngineConfig::decode_graphs`): on an emulated rank
//! a replay runs the recorded step body from the graph's buffers, padded to its bucket,
//! so these tests check what a CUDA graph would replay — the padding rows, the fixed
//! attention launches of a bucket and context bound, the buffers written before each
//! replay, the logits read back from the graph's own buffer — against the same engine
//! run eagerly.

use tessera_engine::device::dtype::{KvCacheDtype, KvCacheDtypeChoice};
use tessera_engine::{generate, Engine, EngineConfig};
use tessera_protocol::Executor;

use crate::common::greedy_opts;
use crate::{batched, model, prompts};

fn engine(path: &std::path::Path, ranks: usize, graphs: bool, hybrid: bool) -> Engine {
    engine_with_kv(path, ranks, graphs, hybrid, None)
}

fn engine_with_kv(
    path: &std::path::Path,
    ranks: usize,
    graphs: bool,
    hybrid: bool,
    kv: Option<KvCacheDtype>,
) -> Engine {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(ranks);
    cfg.emulate_gpu = true;
    cfg.kv_cache_bytes = 32 << 20;
    cfg.max_num_seqs = 8;
    cfg.decode_graphs = graphs;
    cfg.hybrid_kv_cache = hybrid;
    cfg.kv_cache_dtype = kv.map(KvCacheDtypeChoice::Fixed);
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn graph_steps(e: &Engine) -> u64 {
    e.stats()
        .snapshot()
        .iter()
        .map(|r| r.graph_steps)
        .min()
        .unwrap_or(0)
}

/// Replayed rows of a mixture of experts against eager ones: a graph's step routes on
/// the device (`kernels/cuda/moe.cu`), an eager step on the host, and the two sum each
/// expert's products in another order, which a bf16 rounding of the gate/up output can
/// carry into the logits. A wrong expert or weight moves rows by far more (1e-1 and up).
const MOE_ROUTING_BOUND: f32 = 1e-3;

/// Dense, GQA with query/key norms, sliding-window layers (Gemma 3 with one block
/// table), at TP = 1 and 2: every row of the scheduler-like schedule (prefill beside
/// decoding, blocks reused) equals the eager engine's, and the decode-only steps were
/// replayed. Mixtures of experts (Qwen3-MoE's softmax router at TP = 2, GLM-4.5's sigmoid
/// router over groups with a shared expert), whose replayed steps route on the device:
/// within [`MOE_ROUTING_BOUND`] of the eager rows routed on the host, no clear greedy
/// choice different.
#[test]
fn replayed_decode_steps_equal_eager_ones() {
    for (fixture, ranks, bound) in [
        ("tiny-llama", 1, 1e-5),
        ("tiny-qwen3", 2, 1e-5),
        ("tiny-gemma3", 1, 1e-5),
        ("tiny-qwen3-moe", 2, MOE_ROUTING_BOUND),
        ("tiny-glm4-moe", 1, MOE_ROUTING_BOUND),
    ] {
        let path = model(fixture);
        let mut replayed = engine(&path, ranks, true, false);
        let mut eager = engine(&path, ranks, false, false);
        // The graphs' padding rows take a block of their own.
        assert_eq!(
            replayed.kv_cache_shape().num_blocks + 1,
            eager.kv_cache_shape().num_blocks,
            "{fixture}"
        );
        let c = batched::run(&path, &mut replayed, &mut eager);
        let worst = c.errors.iter().copied().fold(0f32, f32::max);
        println!(
            "{fixture} TP={ranks}: {} rows, worst rel L2 {worst:.2e}, {} graph steps",
            c.errors.len(),
            graph_steps(&replayed)
        );
        assert!(c.errors.len() >= 30, "{fixture}: {} rows", c.errors.len());
        assert!(
            worst < bound,
            "{fixture} TP={ranks}: worst row {worst:.2e} from eager"
        );
        assert_eq!(c.differ, 0, "{fixture} TP={ranks}");
        assert!(
            graph_steps(&replayed) >= 3,
            "{fixture}: only {} steps replayed",
            graph_steps(&replayed)
        );
        assert_eq!(graph_steps(&eager), 0, "{fixture}");
    }
}

/// An 8-bit KV cache (int8 with a scale per block and head, fp8 with scales calibrated
/// at load) is written and read by the replayed steps as by eager ones: every row of the
/// schedule equals the eager engine's with the same cache type.
#[test]
fn replayed_steps_over_an_8_bit_cache_equal_eager_ones() {
    let path = model("tiny-llama");
    for dtype in [KvCacheDtype::Int8, KvCacheDtype::Fp8E4m3] {
        let mut replayed = engine_with_kv(&path, 1, true, false, Some(dtype));
        let mut eager = engine_with_kv(&path, 1, false, false, Some(dtype));
        let c = batched::run(&path, &mut replayed, &mut eager);
        let worst = c.errors.iter().copied().fold(0f32, f32::max);
        println!(
            "{dtype:?}: {} rows, worst rel L2 {worst:.2e}, {} graph steps",
            c.errors.len(),
            graph_steps(&replayed)
        );
        assert!(c.errors.len() >= 30, "{dtype:?}: {} rows", c.errors.len());
        assert!(worst < 1e-5, "{dtype:?}: worst row {worst:.2e} from eager");
        assert_eq!(c.differ, 0, "{dtype:?}");
        assert!(graph_steps(&replayed) >= 3, "{dtype:?}: too few replays");
    }
}

/// One sequence alone decodes from the one-row graph: the same text as eager, every
/// decode step replayed, across a context that crosses KV blocks and is split into
/// attention partitions.
#[test]
fn a_single_stream_decodes_the_same_text_from_its_graph() {
    let path = model("tiny-llama");
    let mut replayed = engine(&path, 1, true, false);
    let mut eager = engine(&path, 1, false, false);
    let vocab = eager.model_config().vocab_size;
    for prompt in prompts(vocab) {
        let before = graph_steps(&replayed);
        let want = generate(&mut eager, &prompt, &greedy_opts(12, 0), |_| {}).expect("eager");
        let got = generate(&mut replayed, &prompt, &greedy_opts(12, 0), |_| {}).expect("graphs");
        assert_eq!(got, want, "prompt of {}", prompt.len());
        assert_eq!(
            graph_steps(&replayed) - before,
            11,
            "prompt of {}",
            prompt.len()
        );
    }
}

/// Models a graph cannot hold run eagerly and keep every block: a mixture whose experts
/// have biases (gpt-oss: routed on the host) and hybrid KV groups.
#[test]
fn models_graphs_cannot_hold_run_eagerly() {
    for (fixture, hybrid) in [("tiny-gpt-oss", false), ("tiny-gemma3", true)] {
        let path = model(fixture);
        let mut with = engine(&path, 1, true, hybrid);
        let without = engine(&path, 1, false, hybrid);
        assert_eq!(
            with.kv_cache_shape().num_blocks,
            without.kv_cache_shape().num_blocks,
            "{fixture}"
        );
        let prompt = prompts(with.model_config().vocab_size).swap_remove(0);
        generate(&mut with, &prompt, &greedy_opts(4, 0), |_| {}).expect("generate");
        assert_eq!(graph_steps(&with), 0, "{fixture}");
    }
}
