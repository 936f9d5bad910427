//! Speculation with the model's own multi-token-prediction layer (`mtp`, GLM-4.5's)
//! through the scheduler and the real engine changes no token: greedy output, and seeded
//! sampled output draw for draw, with the layer's guesses equals the output without, for
//! sixteen requests at once and for each alone, on the tiny GLM-4.5 with its layer at
//! TP = 1 and 2 on CPU ranks, and for eight at once on the emulated GPU path (there with
//! an fp8 KV cache too); every KV block comes back.
//! (Its random layer's guesses are rarely kept: `crates/engine/tests/glm4_moe_mtp.rs`
//! holds the guesses themselves to the torch reference, after kept tokens too.)

mod common;

use std::path::PathBuf;

use common::engine_loop::{idle_metrics, run_concurrently, run_each_alone, seeded_tokens};
use tessera_engine::device::dtype::{KvCacheDtype, KvCacheDtypeChoice};
use tessera_engine::{test_models, Engine, EngineConfig};
use tessera_scheduler::{DraftModelSpeculation, EngineLoop, SchedulerConfig, SchedulerHandle};

const MODEL: &str = "tiny-glm4-moe-mtp";
/// The first seed of the sampled requests.
const SEED: u64 = 11;
const MAX_TOKENS: usize = 20;

fn spawn(cfg: &EngineConfig, mtp: bool) -> SchedulerHandle {
    let mut cfg = cfg.clone();
    cfg.mtp = mtp;
    let sched = SchedulerConfig {
        max_batch_tokens: 256,
        max_num_seqs: 16,
        speculation: mtp.then(|| {
            DraftModelSpeculation {
                num_speculative_tokens: 3,
                disable_by_batch_size: 16,
            }
            .into()
        }),
        ..SchedulerConfig::default()
    };
    EngineLoop::spawn(sched, Engine::load(&cfg).expect("engine")).expect("loop")
}

/// The fixture, or on the GPU path a random model of its architecture in the shape the
/// CUDA kernels take.
fn fixture(gpu_path: bool) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    if !gpu_path {
        return dir.join(MODEL);
    }
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("mtp-{MODEL}"));
    let dims = test_models::gpu_shaped(MODEL).expect("dimensions");
    test_models::write(&dir.join(MODEL), &out, &dims, 20261128).expect("random model");
    out
}

#[test]
fn the_mtp_layer_changes_no_token_at_tp_1_and_2() {
    // Sixteen prompts of 4 to 64 tokens: several blocks, and chunks of the step's budget.
    let prompts: Vec<Vec<u32>> = (0..16u32)
        .map(|i| {
            (0..4 + 4 * i)
                .map(|j| 3 + (i * 37 + j * 13) % 500)
                .collect()
        })
        .collect();
    // The fp8 cache sets each slot's scales in a warm-up step, the MTP layer's included.
    let fp8 = Some(KvCacheDtypeChoice::Fixed(KvCacheDtype::Fp8E4m3));
    for (tp, gpu_path, kv_dtype) in [
        (1, false, None),
        (2, false, None),
        (1, true, None),
        (2, true, None),
        (1, true, fp8),
    ] {
        let what = format!("tp={tp}, GPU path: {gpu_path}, KV {kv_dtype:?}");
        let mut cfg = EngineConfig::new(fixture(gpu_path)).with_cpu_ranks(tp);
        cfg.kv_cache_bytes = 32 << 20;
        cfg.emulate_gpu = gpu_path;
        cfg.kv_cache_dtype = kv_dtype;
        // The emulated GPU kernels are slow: half the prompts there, none alone.
        let (together, sampled) = match gpu_path {
            false => (&prompts[..], &prompts[..6]),
            true => (&prompts[..8], &prompts[..3]),
        };
        let base = spawn(&cfg, false);
        let want = run_concurrently(&base, together, MAX_TOKENS);
        let want_sampled = seeded_tokens(&base, sampled, MAX_TOKENS, SEED);
        drop(base);
        let guessing = spawn(&cfg, true);
        assert_eq!(
            run_concurrently(&guessing, together, MAX_TOKENS),
            want,
            "{what}: all at once"
        );
        if !gpu_path {
            assert_eq!(
                run_each_alone(&guessing, &prompts[..4], MAX_TOKENS),
                want[..4],
                "{what}: alone"
            );
        }
        let m = idle_metrics(&guessing);
        println!("{what}: {:?}", m.speculation);
        assert!(m.speculation.draft_tokens > 0, "{what}: no guesses");
        assert_eq!(
            seeded_tokens(&guessing, sampled, MAX_TOKENS, SEED),
            want_sampled,
            "{what}: seeded samples"
        );
        let m = idle_metrics(&guessing);
        assert_eq!(m.kv_blocks_in_use, 0, "{what}: blocks leaked");
    }
}

/// A cache too small for sixteen sequences at once: sequences are preempted and their
/// KV recomputed, the MTP layer's with it, and no token changes. Shared prompt prefixes
/// hit the prefix cache, whose blocks hold the layer's KV as their first sequence wrote
/// it.
#[test]
fn the_mtp_layer_changes_no_token_under_preemption_and_prefix_hits() {
    // Sixteen prompts of 40 to 70 tokens, sharing their first 32 (two blocks).
    let shared: Vec<u32> = (0..32u32).map(|j| 5 + (j * 29) % 480).collect();
    let prompts: Vec<Vec<u32>> = (0..16u32)
        .map(|i| {
            let mut p = shared.clone();
            p.extend((0..8 + 2 * i).map(|j| 3 + (i * 41 + j * 11) % 500));
            p
        })
        .collect();
    let mut cfg = EngineConfig::new(fixture(false));
    // About 30 blocks of 16 tokens: fewer than sixteen sequences of up to 90 tokens need.
    cfg.kv_cache_bytes = 1 << 20;
    let base = spawn(&cfg, false);
    let want = run_concurrently(&base, &prompts, MAX_TOKENS);
    drop(base);
    let guessing = spawn(&cfg, true);
    assert_eq!(run_concurrently(&guessing, &prompts, MAX_TOKENS), want);
    let m = idle_metrics(&guessing);
    println!("{m:?}");
    assert!(m.preemptions_total > 0, "no sequence was preempted: {m:?}");
    assert!(m.prefix_cache_hits_tokens > 0, "no prefix hit: {m:?}");
    assert!(m.speculation.draft_tokens > 0, "no guesses: {m:?}");
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked");
}
