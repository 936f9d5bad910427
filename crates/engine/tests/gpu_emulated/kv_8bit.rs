//! 8-bit KV caches (`--kv-cache-dtype int8` and `fp8`) on the GPU path: the CUDA write
//! kernels quantize keys and values into the cache (int8 with a scale per block and KV
//! head, fp8 with a scale per layer and KV head set by the warm-up step at load) and the
//! attention kernels read them. Each is compared with the GPU path over a bf16 cache and
//! with CPU ranks over the same 8-bit type:
//! - the logits after one prefill of 300 tokens, and after each of 37 positions run one
//!   token a step (decode tiles, int8 blocks written a position at a time, their scales
//!   growing and earlier entries requantized): relative L2, and the mean over positions
//!   of the largest log-probability error on the reference's five most likely tokens,
//!   the measure `docs/fidelity.md` bounds for 8-bit KV on the random-weight families
//!   (0.45 nats int8, 1.4 fp8);
//! - greedy text served in prefill chunks of 7: equal to the bf16 cache's up to its first
//!   top-2 gap under the margin.

use std::path::Path;

use tessera_engine::device::dtype::{KvCacheDtype, KvCacheDtypeChoice};
use tessera_engine::{generate, Engine, EngineConfig};
use tessera_protocol::Executor;

use super::common::{
    agree_until_tie, greedy_opts, last_logits, logits_at_every_position, rel_l2, top_logprob_error,
};
use super::{model, prompts, served_greedy_with_gaps};

/// The fidelity bounds of `docs/fidelity.md` for the random-weight families: the mean
/// top-5 log-probability error against a 16-bit cache (0.45 nats int8, 1.4 fp8). These
/// models are the families in the kernels' head dimensions, wider than the fixtures':
/// here the CPU ranks' own int8 cache is 0.42 nats from their bf16 one on the Gemma 3
/// model (256-wide heads, where one large key sets a block's step), so int8 is held to
/// 0.6.
fn top5_bound(dtype: KvCacheDtype) -> f64 {
    match dtype {
        KvCacheDtype::Int8 => 0.6,
        _ => 1.4,
    }
}

/// Relative L2 of the logits against the bf16 cache's on the GPU path. An 8-bit cache
/// moves logits by more than bf16 activations do; a dropped or wrong scale moves them by
/// whole units.
const LOGITS_BOUND: f32 = 0.15;
/// Greedy text is compared up to the bf16 cache's first top-2 gap under this margin.
const MARGIN: f32 = 0.5;

fn engine(path: &Path, emulate_gpu: bool, dtype: KvCacheDtype) -> Engine {
    let mut cfg = EngineConfig::new(path);
    cfg.emulate_gpu = emulate_gpu;
    cfg.kv_cache_bytes = 32 << 20;
    cfg.kv_cache_dtype = Some(KvCacheDtypeChoice::Fixed(dtype));
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Logits of `e` for the checks: after each of the first prompt's positions (one token
/// a step), then after the whole second prompt (one prefill).
fn logits(e: &mut Engine, decoded: &[u32], prefilled: &[u32]) -> Vec<Vec<f32>> {
    let mut rows = logits_at_every_position(e, decoded);
    rows.push(last_logits(e, prefilled));
    rows
}

/// The mean relative L2 and mean top-5 log-probability error of `got` against `want`,
/// row by row.
fn compare(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f32, f64) {
    let n = got.len().max(1);
    let l2 = got.iter().zip(want).map(|(g, w)| rel_l2(g, w)).sum::<f32>() / n as f32;
    let top5 = got
        .iter()
        .zip(want)
        .map(|(g, w)| top_logprob_error(g, w, 5))
        .sum::<f64>()
        / n as f64;
    (l2, top5)
}

#[test]
fn gpu_path_8_bit_kv_follows_bf16_kv_and_the_cpu_ranks() {
    let mut compared = 0;
    // Full attention, windows (Gemma 3, head dim 256 on some), capped scores (Gemma 2),
    // sinks (gpt-oss), query/key norms (Qwen3).
    for fixture in [
        "tiny-llama",
        "tiny-qwen3",
        "tiny-gemma3",
        "tiny-gemma2",
        "tiny-gpt-oss",
    ] {
        let path = model(fixture);
        let mut bf16 = engine(&path, true, KvCacheDtype::Bf16);
        let vocab = bf16.model_config().vocab_size;
        let p = prompts(vocab);
        let (decoded, prefilled) = (&p[1], &p[2]);
        let reference = logits(&mut bf16, decoded, prefilled);
        let text = served_greedy_with_gaps(&mut bf16, prefilled, 8);
        drop(bf16);
        let cpu_bf16 = logits(
            &mut engine(&path, false, KvCacheDtype::Bf16),
            decoded,
            prefilled,
        );
        for dtype in [KvCacheDtype::Int8, KvCacheDtype::Fp8E4m3] {
            let mut gpu = engine(&path, true, dtype);
            let got = logits(&mut gpu, decoded, prefilled);
            let served = generate(&mut gpu, prefilled, &greedy_opts(8, 7), |_| {})
                .unwrap_or_else(|e| panic!("{fixture} {dtype}: generate: {e}"));
            drop(gpu);
            let mut cpu = engine(&path, false, dtype);
            let on_cpu = logits(&mut cpu, decoded, prefilled);
            drop(cpu);
            let (l2, top5) = compare(&got, &reference);
            let (cpu_l2, cpu_top5) = compare(&got, &on_cpu);
            let (own_l2, own_top5) = compare(&on_cpu, &cpu_bf16);
            let (n, same) = agree_until_tie(&text, &served, MARGIN);
            println!(
                "{fixture} {dtype}: against bf16 KV rel L2 {l2:.2e}, top-5 {top5:.3} nats; \
                 against CPU ranks' {dtype} rel L2 {cpu_l2:.2e}, top-5 {cpu_top5:.3} nats; \
                 greedy equal over {n} of 8 tokens (CPU ranks: {dtype} from bf16 rel L2 \
                 {own_l2:.2e}, top-5 {own_top5:.3})"
            );
            let bound = top5_bound(dtype);
            assert!(
                l2 < LOGITS_BOUND && top5 < bound,
                "{fixture} {dtype}: rel L2 {l2:.2e}, top-5 {top5:.3} from the bf16 cache's"
            );
            assert!(
                cpu_l2 < LOGITS_BOUND && cpu_top5 < bound,
                "{fixture} {dtype}: rel L2 {cpu_l2:.2e}, top-5 {cpu_top5:.3} from CPU ranks'"
            );
            assert!(
                same,
                "{fixture} {dtype}: served {served:?}, bf16 KV {:?} (gaps {:?})",
                text.0, text.1
            );
            compared += n;
        }
    }
    assert!(compared >= 40, "only {compared} greedy tokens compared");
}

#[test]
fn gpu_path_8_bit_kv_holds_twice_the_blocks_of_bf16() {
    let path = model("tiny-llama");
    let blocks = |d| engine(&path, true, d).kv_cache_shape().num_blocks;
    let bf16 = blocks(KvCacheDtype::Bf16);
    for d in [KvCacheDtype::Int8, KvCacheDtype::Fp8E4m3] {
        let ratio = blocks(d) as f64 / bf16 as f64;
        println!("{d}: {ratio:.3}x the blocks of bf16 ({bf16})");
        assert!((1.9..=2.005).contains(&ratio), "{d}: {ratio}x");
    }
    // What the kernels cannot hold is refused by name.
    let mut cfg = EngineConfig::new(&path);
    cfg.emulate_gpu = true;
    cfg.kv_cache_dtype = Some(KvCacheDtypeChoice::Fixed(KvCacheDtype::F16));
    let err = Engine::load(&cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("CUDA ranks") && err.contains("int8"), "{err}");
}
