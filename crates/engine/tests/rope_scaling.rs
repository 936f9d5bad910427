//! RoPE scaling against transformers' float32 logits, from safetensors and from GGUF, at
//! every TP size: Llama 3.1's `llama3` scheme (in a GGUF, llama.cpp's per-frequency
//! divisors `rope_freqs.weight`), YaRN on a Qwen3 (cos and sin scaled by its attention
//! factor), Gemma 3's linear scaling of its global layers only, and Phi-4-mini's LongRoPE
//! over the rotated three quarters of each head (short or long factors by the served
//! context). Each model is also loaded with its scaling removed or changed, to show that
//! the reference depends on it.

mod common;

use common::*;
use tessera_engine::{Engine, EngineConfig};

fn check(model: &str) {
    for tp in 1..=4 {
        check_against_transformers(model, &fixtures().join(model), tp, 1e-5);
    }
}

fn check_gguf(model: &str) {
    let path = fixtures().join(format!("{model}.gguf"));
    for tp in 1..=4 {
        check_against_transformers(model, &path, tp, 1e-5);
    }
}

/// With its scaling changed by `edit` (removed, or put where it does not belong) a model
/// is far from its reference: the fixtures tell the schemes apart from plain RoPE.
fn far_off_when_edited(model: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let plain = edited_copy(model, edit);
    let scaled_err = long_case_error(model, &fixtures().join(model));
    let plain_err = long_case_error(model, &plain.0);
    println!("{model}: rel L2 {scaled_err:.2e} as saved, {plain_err:.2e} edited");
    assert!(
        plain_err > 1000.0 * scaled_err.max(1e-7),
        "{model}: {plain_err}"
    );
}

/// `rope_scaling` of type `llama3` as Llama 3.1, 3.2 and 3.3 ship it (transformers-4
/// layout); 4 query heads over 2 KV heads, replicated at TP = 3 and 4.
#[test]
fn llama3_scaling_matches_transformers_at_every_tp_size() {
    check("tiny-llama3");
}

/// The same model as llama.cpp converts it: the scaling as `rope_freqs.weight`.
#[test]
fn llama3_gguf_with_rope_freqs_matches_transformers_at_every_tp_size() {
    check_gguf("tiny-llama3");
}

#[test]
fn llama3_reference_depends_on_the_scaling() {
    far_off_when_edited("tiny-llama3", |c| {
        c["rope_scaling"] = serde_json::Value::Null
    });
}

/// YaRN: frequencies interpolated by parts, cos and sin times 1 + 0.1 ln 4.
#[test]
fn yarn_scaling_matches_transformers_at_every_tp_size() {
    check("tiny-qwen3-yarn");
}

/// The same weights with `qwen3.rope.scaling.{type,factor,original_context_length}`.
#[test]
fn yarn_gguf_matches_transformers_at_every_tp_size() {
    check_gguf("tiny-qwen3-yarn");
}

#[test]
fn yarn_reference_depends_on_the_scaling() {
    far_off_when_edited("tiny-qwen3-yarn", |c| {
        c["rope_scaling"] = serde_json::Value::Null
    });
}

/// Gemma 3 (4B and up): linear scaling in the global layers, none in the sliding ones.
#[test]
fn gemma3_linear_scaling_of_global_layers_matches_transformers_at_every_tp_size() {
    check("tiny-gemma3-linear");
}

#[test]
fn gemma3_linear_gguf_matches_transformers_at_every_tp_size() {
    check_gguf("tiny-gemma3-linear");
}

/// Both directions matter: dropping the global layers' scaling, or also scaling the
/// sliding layers, moves the logits far from the reference.
#[test]
fn gemma3_reference_depends_on_which_layers_scale() {
    far_off_when_edited("tiny-gemma3-linear", |c| {
        c["rope_parameters"]["full_attention"] =
            serde_json::json!({"rope_type": "default", "rope_theta": 1_000_000.0});
    });
    far_off_when_edited("tiny-gemma3-linear", |c| {
        c["rope_parameters"]["sliding_attention"] =
            serde_json::json!({"rope_type": "linear", "factor": 8.0, "rope_theta": 10_000.0});
    });
}

/// A scheme the engine does not compute is refused at load, by name, rather than run as
/// plain RoPE.
#[test]
fn unsupported_schemes_are_refused_at_load() {
    for (scaling, needle) in [
        (
            serde_json::json!({"rope_type": "dynamic", "factor": 2.0}),
            "rope_scaling: rope_type 'dynamic' is not supported",
        ),
        (
            serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            "rope_scaling: rope_type 'llama3' needs 'low_freq_factor'",
        ),
    ] {
        let dir = edited_copy("tiny-llama3", |c| c["rope_scaling"] = scaling);
        let err = Engine::load(&EngineConfig::new(&dir.0).with_cpu_ranks(1))
            .err()
            .expect("refused");
        assert!(err.to_string().contains(needle), "{err}");
    }
}

/// Phi-4-mini's RoPE: three quarters of each head rotate, with LongRoPE. Served within
/// the pretraining context of 32 (`--max-model-len 32`), the short factors run, as
/// transformers runs them for inputs that fit it (the 5- and 20-token cases); served with
/// the model's context of 128, the long ones, as transformers runs them for the 60-token
/// case.
fn check_phi4_mini(path: &std::path::Path) {
    for tp in 1..=4 {
        let mut within = EngineConfig::new(path).with_cpu_ranks(tp);
        within.max_model_len = Some(32);
        check_cases_against_transformers("tiny-phi4-mini", &within, &["len5", "len20"], 1e-5);
        let beyond = EngineConfig::new(path).with_cpu_ranks(tp);
        check_cases_against_transformers("tiny-phi4-mini", &beyond, &["len60"], 1e-5);
    }
}

#[test]
fn phi4_mini_partial_rotary_and_longrope_match_transformers_at_every_tp_size() {
    check_phi4_mini(&fixtures().join("tiny-phi4-mini"));
}

/// The same weights as llama.cpp writes them: `rope.dimension_count` 24 of 32, the two
/// factor tensors, and the attention factor and pretraining context in the metadata.
#[test]
fn phi4_mini_gguf_matches_transformers_at_every_tp_size() {
    check_phi4_mini(&fixtures().join("tiny-phi4-mini.gguf"));
}

/// The factors matter: served with the long ones, the 20-token case is far from the
/// reference that ran it with the short ones.
#[test]
fn longrope_factors_follow_the_served_context() {
    let path = fixtures().join("tiny-phi4-mini");
    let reference = read_json(fixtures().join("tiny-phi4-mini/reference.json"));
    let case = &reference["cases"][1];
    assert_eq!(case["name"], "len20");
    let err = |max_model_len| {
        let mut cfg = EngineConfig::new(&path);
        cfg.max_model_len = max_model_len;
        let mut engine = Engine::load(&cfg).expect("load");
        rel_l2(
            &last_logits(&mut engine, &ids(&case["input_ids"])),
            &floats(&case["last_logits"]),
        )
    };
    let (short, long) = (err(Some(32)), err(None));
    println!("len20: rel L2 {short:.2e} with the short factors, {long:.2e} with the long");
    assert!(long > 1000.0 * short.max(1e-7), "{long}");
}

/// Rotating whole heads instead (with factors for all 16 pairs) is far from the
/// reference: the fixture tells partial rotary apart.
#[test]
fn phi4_mini_reference_depends_on_the_partial_rotary() {
    far_off_when_edited("tiny-phi4-mini", |c| {
        c["partial_rotary_factor"] = 1.0.into();
        for key in ["short_factor", "long_factor"] {
            let factors = c["rope_scaling"][key].as_array_mut().expect("factors");
            factors.resize(16, 1.0.into());
        }
    });
}

/// `--max-model-len` past the model's context is refused by name at load.
#[test]
fn a_served_context_beyond_the_model_is_refused() {
    let mut cfg = EngineConfig::new(fixtures().join("tiny-phi4-mini"));
    cfg.max_model_len = Some(129);
    match Engine::load(&cfg) {
        Err(e) => assert!(
            e.to_string()
                .contains("--max-model-len 129 must be between 1 and the model's context of 128"),
            "{e}"
        ),
        Ok(_) => panic!("a context of 129 was accepted"),
    }
}
