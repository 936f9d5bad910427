//! Speculation with a draft model through the scheduler and the real engine changes no
//! token: greedy output (and seeded sampled output, draw for draw) with the draft's
//! guesses equals the output without, alone and with sixteen requests at once, on the
//! real SmolLM2 file as its own draft and on tiny random-weight models at TP = 1 and 2
//! (the draft on the first rank) — with a draft that agrees with the model and one that
//! mostly does not; every KV block comes back.

mod common;

use std::path::{Path, PathBuf};

use common::engine_loop::{greedy_request, idle_metrics, run_concurrently, stream_all};
use tessera_engine::{load_drafted, load_tokenizer, Engine, EngineConfig};
use tessera_protocol::{GenerationRequest, SamplingParams};
use tessera_scheduler::{
    DraftModelSpeculation, EngineLoop, SchedulerConfig, SchedulerHandle, SchedulerMetrics,
};

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

fn alone(handle: &SchedulerHandle, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| run_concurrently(handle, std::slice::from_ref(p), MAX_TOKENS).remove(0))
        .collect()
}

/// Sampled requests with seeds: the same draws with guesses as without.
fn sampled(prompts: &[Vec<u32>]) -> Vec<GenerationRequest> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = greedy_request(p, MAX_TOKENS);
            r.sampling = SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                seed: Some(7 + i as u64),
                ..SamplingParams::default()
            };
            r
        })
        .collect()
}

fn acceptance(m: &SchedulerMetrics) -> f64 {
    m.speculation.accepted_tokens as f64 / m.speculation.draft_tokens.max(1) as f64
}

#[test]
fn smollm2_as_its_own_draft_keeps_its_output_and_has_its_guesses_kept() {
    let model = std::env::var("TESSERA_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| tessera_engine::default_model_path());
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
    let want = alone(&base, &prompts);
    let want_sampled: Vec<_> = stream_all(&base, &sampled(&prompts))
        .into_iter()
        .map(|s| s.0)
        .collect();
    drop(base);

    let guessing = drafted(&cfg, &model);
    assert_eq!(
        alone(&guessing, &prompts),
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
    let got_sampled: Vec<_> = stream_all(&guessing, &sampled(&prompts))
        .into_iter()
        .map(|s| s.0)
        .collect();
    assert_eq!(got_sampled, want_sampled, "guesses changed seeded samples");
    let m = idle_metrics(&guessing);
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
}

#[test]
fn tiny_models_keep_their_output_with_a_draft_at_tp_1_and_2() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
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
    ] {
        for tp in [1, 2] {
            let what = format!("{model} with draft {draft}, tp={tp}");
            let cfg = EngineConfig::new(fixtures.join(model)).with_cpu_ranks(tp);
            let base = plain(&cfg);
            let want = run_concurrently(&base, &prompts, MAX_TOKENS);
            let want_sampled: Vec<_> = stream_all(&base, &sampled(&prompts))
                .into_iter()
                .map(|s| s.0)
                .collect();
            drop(base);
            let guessing = drafted(&cfg, &fixtures.join(draft));
            assert_eq!(
                run_concurrently(&guessing, &prompts, MAX_TOKENS),
                want,
                "{what}"
            );
            // Greedy guesses against greedy choices (sampled ones are kept less often).
            let m = idle_metrics(&guessing);
            println!("{what}: {:?}", m.speculation);
            assert!(m.speculation.draft_tokens > 0, "{what}: no guesses");
            match kept {
                true => assert!(acceptance(&m) > 0.9, "{what}: {:?}", m.speculation),
                false => assert!(acceptance(&m) < 0.5, "{what}: {:?}", m.speculation),
            }
            let got_sampled: Vec<_> = stream_all(&guessing, &sampled(&prompts))
                .into_iter()
                .map(|s| s.0)
                .collect();
            assert_eq!(got_sampled, want_sampled, "{what}: seeded samples");
            let m = idle_metrics(&guessing);
            assert_eq!(m.kv_blocks_in_use, 0, "{what}");
        }
    }
}
