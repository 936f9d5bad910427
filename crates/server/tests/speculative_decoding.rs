//! N-gram speculation through the scheduler and the real engine changes no token: greedy
//! output with guesses equals the output without, alone and with sixteen requests at
//! once (prefills and decodes mixed, guesses verified in the same steps), on the real
//! SmolLM2 file and on tiny random-weight models at TP = 1 and 2; guesses are accepted
//! where the output repeats its context, and every KV block comes back.

mod common;

use std::path::PathBuf;

use common::engine_loop::{
    idle_metrics, run_concurrently, run_each_alone, spawn_loop_with, test_model,
};
use tessera_engine::{load_tokenizer, EngineConfig};
use tessera_scheduler::{NgramSpeculation, SchedulerConfig};

const MAX_TOKENS: usize = 24;

fn scheduler(speculation: Option<NgramSpeculation>) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_tokens: 256,
        max_num_seqs: 16,
        speculation: speculation.map(Into::into),
        ..SchedulerConfig::default()
    }
}

fn ngram() -> Option<NgramSpeculation> {
    Some(NgramSpeculation {
        num_speculative_tokens: 4,
        prompt_lookup_min: 1,
        prompt_lookup_max: 4,
        disable_by_batch_size: 16,
    })
}

#[test]
fn smollm2_greedy_output_is_unchanged_by_ngram_guesses() {
    let model = test_model();
    let tok = load_tokenizer(&model).expect("tokenizer");
    let texts = [
        // Output that repeats its context: guesses pay.
        "Repeat exactly: the cat sat on the mat. Repeat exactly: the cat sat on the mat. Repeat exactly:",
        "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,",
        "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
        // Free text.
        "The three primary colors are",
        "Once upon a time, in a small village by the sea,",
        "The capital of Japan is",
        "import numpy as np\nx = np.",
        "A haiku about autumn:\n",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode(t, true).expect("encode"))
        .collect();
    let cfg = EngineConfig::new(&model);
    let plain = spawn_loop_with(&cfg, scheduler(None));
    let want = run_each_alone(&plain, &prompts, MAX_TOKENS);
    drop(plain);

    let guessing = spawn_loop_with(&cfg, scheduler(ngram()));
    assert_eq!(
        run_each_alone(&guessing, &prompts, MAX_TOKENS),
        want,
        "guesses changed a request alone"
    );
    let mut sixteen = prompts.clone();
    sixteen.extend(prompts.iter().cloned());
    let together = run_concurrently(&guessing, &sixteen, MAX_TOKENS);
    assert_eq!(
        together[..8],
        want[..],
        "guesses changed a request in a batch"
    );
    assert_eq!(together[8..], want[..]);
    let m = idle_metrics(&guessing);
    println!("{:?}", m.speculation);
    assert!(m.speculation.accepted_tokens > 20, "{:?}", m.speculation);
    assert!(m.speculation.draft_tokens > m.speculation.accepted_tokens);
    assert_eq!(m.kv_blocks_in_use, 0, "blocks leaked: {m:?}");
}

#[test]
fn tiny_models_keep_their_greedy_output_with_guesses_at_tp_1_and_2() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    // Prompts that repeat themselves, so some guesses are made and some kept.
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| {
            let motif: Vec<u32> = (0..3 + i).map(|j| 7 + (i * 31 + j * 17) % 400).collect();
            motif
                .iter()
                .cycle()
                .take(motif.len() * 4)
                .copied()
                .collect()
        })
        .collect();
    for model in ["tiny-qwen3", "tiny-llama"] {
        for tp in [1, 2] {
            let cfg = EngineConfig::new(fixtures.join(model)).with_cpu_ranks(tp);
            let plain = spawn_loop_with(&cfg, scheduler(None));
            let want = run_concurrently(&plain, &prompts, MAX_TOKENS);
            drop(plain);
            let guessing = spawn_loop_with(&cfg, scheduler(ngram()));
            let got = run_concurrently(&guessing, &prompts, MAX_TOKENS);
            assert_eq!(got, want, "{model} tp={tp}");
            let m = idle_metrics(&guessing);
            println!("{model} tp={tp}: {:?}", m.speculation);
            assert!(
                m.speculation.draft_tokens > 0,
                "{model} tp={tp}: no guesses"
            );
            assert_eq!(m.kv_blocks_in_use, 0);
        }
    }
}
