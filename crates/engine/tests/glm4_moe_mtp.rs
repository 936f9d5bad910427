//! GLM-4.5's multi-token-prediction layer (`--speculative-config` method `mtp`) against
//! its float32 torch reference (`tests/fixtures/models/make_glm4_moe_mtp.py`): the tiny
//! GLM-4.5 of `glm4_moe.rs` with an MTP layer (a mixture-of-experts decoder layer with its
//! own norms, projection and head) after its three layers. One sequence per case runs
//! step after step, each step scoring the previous step's three guesses and asking for
//! three more: after every token the guesses equal the reference's (the layer's KV over
//! every settled position, its first pass reading the model's hidden states and the next
//! two its own output), and the tokens emitted equal transformers' greedy continuation,
//! the guesses rejected. At TP = 1..3 (the layer's heads, experts and head split as the
//! model's are), and from the same weights in a GGUF file.

mod common;

use common::one_sequence::{self, finish, only_sample, SEQ};
use common::*;
use serde_json::Value;
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::{NewSequence, SamplingParams, ScheduledChunk, StepPlan};

const MODEL: &str = "tiny-glm4-moe-mtp";
const GUESSES: usize = 3;

fn engine(tp: usize, mtp: bool) -> Engine {
    engine_of(&fixtures().join(MODEL), tp, mtp)
}

fn engine_of(path: &std::path::Path, tp: usize, mtp: bool) -> Engine {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(tp);
    cfg.kv_cache_bytes = 16 << 20;
    cfg.mtp = mtp;
    Engine::load(&cfg).unwrap_or_else(|e| panic!("TP={tp}: {e}"))
}

fn reference() -> Value {
    read_json(fixtures().join(MODEL).join("mtp_reference.json"))
}

fn chunk(tokens: Vec<u32>, start_pos: usize, num_draft: usize) -> ScheduledChunk {
    let blocks: Vec<u32> = (0..8).collect();
    one_sequence::chunk(tokens, start_pos, num_draft, GUESSES, &blocks)
}

/// What each step scores after the sequence's last token.
#[derive(Clone, Copy)]
enum Scored {
    /// The layer's own guesses (the reference's: the model keeps none).
    OwnGuesses,
    /// The next 1, 2, 3, 1, ... tokens of the greedy continuation, which the model keeps:
    /// the layer must then cover every position the step settled.
    KeptTokens,
}

/// Runs `case` as the reference does; returns how many of its steps were checked.
fn follow_case(engine: &mut Engine, case: &Value, scored: Scored, label: &str) -> usize {
    let prompt = ids(&case["input_ids"]);
    let greedy = ids(&case["greedy_ids"]);
    let steps = case["steps"].as_array().expect("steps");
    let first = StepPlan {
        new_sequences: vec![NewSequence {
            id: SEQ,
            sampling: SamplingParams::greedy(),
            prompt_ids: prompt.clone(),
        }],
        scheduled: vec![chunk(prompt.clone(), 0, 0)],
        finished: Vec::new(),
    };
    let mut sample = only_sample(engine, &first);
    let mut context = prompt.clone();
    context.push(sample.token);
    let mut checked = 0;
    loop {
        let m = context.len() - 1;
        // The context so far is transformers' greedy continuation.
        assert_eq!(
            &context[prompt.len()..],
            &greedy[..context.len() - prompt.len()],
            "{label}: emitted tokens"
        );
        let Some(step) = steps.iter().find(|s| s["m"].as_u64() == Some(m as u64)) else {
            break;
        };
        assert_eq!(
            sample.proposed,
            ids(&step["proposals"]),
            "{label}: guesses after position {m}"
        );
        checked += 1;
        if context.len() == prompt.len() + greedy.len() {
            break;
        }
        let guesses = match scored {
            Scored::OwnGuesses => sample.proposed.clone(),
            Scored::KeptTokens => {
                let from = m + 1 - prompt.len();
                let want = 1 + checked % GUESSES;
                greedy[from..(from + want).min(greedy.len() - 1)].to_vec()
            }
        };
        let mut tokens = vec![context[m]];
        tokens.extend(&guesses);
        let plan = StepPlan {
            scheduled: vec![chunk(tokens, m, guesses.len())],
            ..StepPlan::default()
        };
        sample = only_sample(engine, &plan);
        if let Scored::KeptTokens = scored {
            assert_eq!(sample.accepted.len(), guesses.len(), "{label}: kept at {m}");
        }
        context.push(sample.token);
        context.extend(sample.accepted.iter().map(|(t, _)| *t));
        context.truncate(prompt.len() + greedy.len());
    }
    checked
}

#[test]
fn mtp_guesses_match_the_torch_reference_at_every_tp_size() {
    let reference = reference();
    let cases = reference["cases"].as_array().expect("cases");
    for tp in 1..=3 {
        let mut engine = engine(tp, true);
        for (i, case) in cases.iter().enumerate() {
            let label = format!("TP={tp} {}", case["name"]);
            let checked = follow_case(&mut engine, case, Scored::OwnGuesses, &label);
            let want = case["steps"].as_array().map_or(0, Vec::len);
            assert_eq!(checked, want, "{label}: steps checked");
            finish(&mut engine);
            println!("{label}: {checked} steps of {GUESSES} guesses agree (case {i})");
        }
    }
}

/// The same weights as llama.cpp's converter writes them (`tiny-glm4-moe-mtp.gguf`, the
/// layer's own tensors under `blk.3.nextn.*`, its decoder layer under `blk.3.*`, all
/// f32): the same guesses.
#[test]
fn mtp_guesses_from_the_gguf_file_match_the_reference() {
    let reference = reference();
    let path = fixtures().join("tiny-glm4-moe-mtp.gguf");
    for tp in [1, 2] {
        let mut engine = engine_of(&path, tp, true);
        for case in reference["cases"].as_array().expect("cases") {
            let label = format!("GGUF TP={tp} {}", case["name"]);
            let checked = follow_case(&mut engine, case, Scored::OwnGuesses, &label);
            assert_eq!(
                checked,
                case["steps"].as_array().map_or(0, Vec::len),
                "{label}"
            );
            finish(&mut engine);
        }
    }
}

/// Steps that keep 1 to 3 scored tokens each: the layer runs over every position the
/// step settled, so its guesses after each step still equal the reference's (which
/// assumes every earlier position was run with the model's hidden state there).
#[test]
fn mtp_guesses_after_kept_tokens_match_the_reference() {
    let reference = reference();
    for tp in [1, 2] {
        let mut engine = engine(tp, true);
        for case in reference["cases"].as_array().expect("cases") {
            let label = format!("TP={tp} {} kept", case["name"]);
            let checked = follow_case(&mut engine, case, Scored::KeptTokens, &label);
            // Steps keep 1, 2, 3, 1, ... tokens: 8 positions hold 3 or 4 checks.
            assert!(checked >= 3, "{label}: {checked} steps checked");
            println!("{label}: {checked} steps agree");
            finish(&mut engine);
        }
    }
}

/// Without `mtp` the model's layer is not loaded and a step makes no guesses, even when
/// asked.
#[test]
fn without_mtp_no_guesses_are_made() {
    let reference = reference();
    let case = &reference["cases"][0];
    for path in [MODEL, "tiny-glm4-moe-mtp.gguf"].map(|m| fixtures().join(m)) {
        let mut engine = engine_of(&path, 1, false);
        let plan = StepPlan {
            new_sequences: vec![NewSequence {
                id: SEQ,
                sampling: SamplingParams::greedy(),
                prompt_ids: ids(&case["input_ids"]),
            }],
            scheduled: vec![chunk(ids(&case["input_ids"]), 0, 0)],
            finished: Vec::new(),
        };
        let s = only_sample(&mut engine, &plan);
        assert_eq!(s.token, ids(&case["greedy_ids"])[0]);
        assert!(s.proposed.is_empty(), "{:?}", s.proposed);
    }
}

/// `mtp` is refused at load, naming why, where there is no layer to run: a family
/// without one, MiniMax-M2 (whose published weights hold none for the modules its config
/// names), a GLM-4.5 checkpoint without the layer's tensors, and a layer map.
#[test]
fn mtp_is_refused_where_there_is_no_layer_to_run() {
    let refusal = |cfg: EngineConfig| match Engine::load(&cfg) {
        Ok(_) => panic!("{} loaded with mtp", cfg.model_path.display()),
        Err(e) => e.to_string(),
    };
    let with_mtp = |model: &str| {
        let mut cfg = EngineConfig::new(fixtures().join(model));
        cfg.mtp = true;
        cfg
    };
    let cases = [
        (
            with_mtp("tiny-llama"),
            "llama models have no multi-token-prediction layer",
        ),
        (
            with_mtp("tiny-minimax-m2"),
            "MiniMax-M2's published checkpoints hold no weights",
        ),
        (
            with_mtp("tiny-glm4-moe"),
            "model.layers.3.eh_proj.weight is missing",
        ),
        (
            EngineConfig {
                device_layers: Some("0:2;1:1".parse().expect("a map")),
                ..with_mtp(MODEL).with_cpu_ranks(2)
            },
            "not across a layer map's stages or nodes",
        ),
    ];
    for (cfg, want) in cases {
        let got = refusal(cfg);
        assert!(got.contains(want), "{got}");
    }
}
