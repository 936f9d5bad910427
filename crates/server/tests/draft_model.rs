//! Speculation with a draft model through the scheduler and the real engine changes no
//! token: greedy output (and seeded sampled output, draw for draw) with the draft's
//! guesses equals the output without, alone and with sixteen requests at once, on the
//! real SmolLM2 file as its own draft and on tiny random-weight models at TP = 1 and 2
//! (the draft on the first rank), on CPU ranks and on the emulated GPU path — with a draft that agrees with the model and one that
//! mostly does not; every KV block comes back.

mod common;

use std::path::{Path, PathBuf};

use common::engine_loop::{
    idle_metrics, run_concurrently, run_each_alone, seeded_tokens, test_model,
};
use tessera_engine::{load_drafted, load_tokenizer, test_models, Engine, EngineConfig};
use tessera_scheduler::{
    DraftModelSpeculation, EngineLoop, SchedulerConfig, SchedulerHandle, SchedulerMetrics,
};

/// The first seed of the sampled requests.
const SEED: u64 = 7;
const MAX_TOKENS: usize = 24;

fn scheduler(draft: bool) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_tokens: 256,
        max_num_seqs: 16,
        speculation: draft.then(|| {
            DraftModelSpeculation {
                num_speculative_tokens: 4,
                disable_by_batch_size: 16,
            }
            .into()
        }),
        ..SchedulerConfig::default()
    }
}

fn plain(cfg: &EngineConfig) -> SchedulerHandle {
    EngineLoop::spawn(scheduler(false), Engine::load(cfg).expect("engine")).expect("loop")
}

fn drafted(cfg: &EngineConfig, draft: &Path) -> SchedulerHandle {
    let ex = load_drafted(cfg, draft).expect("model and draft");
    EngineLoop::spawn(scheduler(true), ex).expect("loop")
}

/// The tiny fixture `name`, in the shape the CUDA kernels take on the GPU path.
fn fixture(name: &str, gpu_path: bool) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    if !gpu_path {
        return dir.join(name);
    }
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("draft-model-{name}"));
    let dims = test_models::gpu_shaped(name).expect("dimensions");
    test_models::write(&dir.join(name), &out, &dims, 20261127).expect("random model");
    out
}

fn acceptance(m: &SchedulerMetrics) -> f64 {
    m.speculation.accepted_tokens as f64 / m.speculation.draft_tokens.max(1) as f64
}

#[test]
fn smollm2_as_its_own_draft_keeps_its_output_and_has_its_guesses_kept() {
    let model = test_model();
    let tok = load_tokenizer(&model).expect("tokenizer");
    let texts = [
        "The three primary colors are",
        "Once upon a time, in a small village by the sea,",
        "def fibonacci(n):\n",
        "The capital of Japan is",
        "A haiku about autumn:\n",
        "1, 2, 3, 4, 1, 2, 3, 4, 1, 2,",
        "import numpy as np\nx = np.",
        "Water boils at",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode(t, true).expect("encode"))
        .collect();
    let cfg = EngineConfig::new(&model);
    let base = plain(&cfg);
    let want = run_each_alone(&base, &prompts, MAX_TOKENS);
    let want_sampled = seeded_tokens(&base, &prompts, MAX_TOKENS, SEED);
    drop(base);

    let guessing = drafted(&cfg, &model);
    assert_eq!(
        run_each_alone(&guessing, &prompts, MAX_TOKENS),
        want,
        "guesses changed a request alone"
    );
    let m = idle_metrics(&guessing);
    println!("alone: {:?}", m.speculation);
    // The draft is the model itself: only rows whose batched sums round differently
    // can disagree.
    assert!(acceptance(&m) > 0.9, "{:?}", m.speculation);
    let mut sixteen = prompts.clone();
    sixteen.extend(prompts.iter().cloned());
    let together = run_concurrently(&guessing, &sixteen, MAX_TOKENS);
    assert_eq!(
        together[..8],
        want[..],
        "guesses changed a request in a batch"
    );
    assert_eq!(together[8..], want[..]);
    let got_sampled = seeded_tokens(&guessing, &prompts, MAX_TOKENS, SEED);
    assert_eq!(got_sampled, want_sampled, "guesses changed seeded samples");
    let m = idle_metrics(&guessing);
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
}

/// On CPU ranks and on the GPU path (the CUDA kernels emulated; the draft takes the
/// path its first rank takes).
#[test]
fn tiny_models_keep_their_output_with_a_draft_at_tp_1_and_2() {
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| {
            (0..5 + 3 * i)
                .map(|j| 7 + (i * 31 + j * 17) % 400)
                .collect()
        })
        .collect();
    // The model as its own draft (guesses kept), and another model of the same
    // vocabulary (guesses mostly rejected).
    for (model, draft, kept) in [
        ("tiny-llama", "tiny-llama", true),
        ("tiny-llama", "tiny-qwen3", false),
        ("tiny-qwen3", "tiny-qwen3", true),
        // Hybrid KV groups (sliding layers release blocks behind their window): the
        // draft reads group 0's table, which keeps the whole context.
        ("tiny-gemma3", "tiny-gemma3", true),
    ] {
        // The GPU path for one model (its emulated kernels are slow).
        let gpu_runs: &[_] = match model {
            "tiny-llama" => &[(1, true), (2, true)],
            _ => &[],
        };
        for &(tp, gpu_path) in [(1, false), (2, false)].iter().chain(gpu_runs) {
            let what = format!("{model} with draft {draft}, tp={tp}, GPU path: {gpu_path}");
            let mut cfg = EngineConfig::new(fixture(model, gpu_path)).with_cpu_ranks(tp);
            cfg.emulate_gpu = gpu_path;
            let base = plain(&cfg);
            let want = run_concurrently(&base, &prompts, MAX_TOKENS);
            let want_sampled = seeded_tokens(&base, &prompts, MAX_TOKENS, SEED);
            drop(base);
            let guessing = drafted(&cfg, &fixture(draft, gpu_path));
            assert_eq!(
                run_concurrently(&guessing, &prompts, MAX_TOKENS),
                want,
                "{what}"
            );
            // Greedy guesses against greedy choices (sampled ones are kept less often).
            let m = idle_metrics(&guessing);
            println!("{what}: {:?}", m.speculation);
            assert!(m.speculation.draft_tokens > 0, "{what}: no guesses");
            // (The GPU-shaped random models mostly repeat a few tokens, whichever the
            // family: there a disagreeing draft agrees often too.)
            match (kept, gpu_path) {
                (true, _) => assert!(acceptance(&m) > 0.9, "{what}: {:?}", m.speculation),
                (false, false) => assert!(acceptance(&m) < 0.5, "{what}: {:?}", m.speculation),
                (false, true) => {}
            }
            let got_sampled = seeded_tokens(&guessing, &prompts, MAX_TOKENS, SEED);
            assert_eq!(got_sampled, want_sampled, "{what}: seeded samples");
            let m = idle_metrics(&guessing);
            assert_eq!(m.kv_blocks_in_use, 0, "{what}");
        }
    }
}
