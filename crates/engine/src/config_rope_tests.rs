//! Tests of RoPE scaling (`config_rope.rs`).

use super::*;
use serde_json::json;

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-12 * y.abs())
}

/// Llama 3.1 8B's parameters (head 128, base 500000, factor 8 over 8192 positions).
fn llama31() -> RopeScaling {
    RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context: 8192.0,
    }
}

#[test]
fn llama_cpp_frequency_divisors_give_the_llama3_frequencies() {
    let plain = RopeScaling::None.inv_freq(128, 500_000.0);
    let scaled = llama31().inv_freq(128, 500_000.0);
    // llama.cpp's converter writes the divisor of each frequency.
    let factors: Vec<f32> = plain
        .iter()
        .zip(&scaled)
        .map(|(p, s)| (p / s) as f32)
        .collect();
    let kept = factors.iter().filter(|f| **f == 1.0).count();
    let stretched = factors.iter().filter(|f| **f == 8.0).count();
    assert!(
        kept > 0 && stretched > 0 && kept + stretched < 64,
        "{factors:?}"
    );
    let from_file = RopeScaling::FreqFactors(factors).inv_freq(128, 500_000.0);
    assert!(from_file
        .iter()
        .zip(&scaled)
        .all(|(a, b)| (a - b).abs() <= 1e-6 * b));
}

#[test]
fn yarn_ramps_between_kept_and_interpolated_frequencies() {
    // tiny-qwen3-yarn: head 32, base 1e6, original context 32: the ramp runs over
    // pairs 0..2.
    let yarn = RopeScaling::from_hf(
        &json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
        "rope_scaling",
        128,
    )
    .expect("yarn");
    let plain = RopeScaling::None.inv_freq(32, 1e6);
    let f = yarn.inv_freq(32, 1e6);
    assert_eq!(f[0], plain[0]);
    assert!((f[1] - (plain[1] + plain[1] / 4.0) / 2.0).abs() < 1e-15);
    assert!(close(
        &f[2..],
        &plain[2..].iter().map(|p| p / 4.0).collect::<Vec<_>>()
    ));
    assert!((yarn.attention_factor() - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-15);
}

#[test]
fn hugging_face_layouts_and_names() {
    let parse = |v: serde_json::Value| RopeScaling::from_hf(&v, "rope_scaling", 4096);
    assert_eq!(parse(json!(null)).ok(), Some(RopeScaling::None));
    assert_eq!(
        parse(json!({"rope_type": "default", "rope_theta": 1e6})).ok(),
        Some(RopeScaling::None)
    );
    assert_eq!(
        parse(json!({"type": "linear", "factor": 8.0})).ok(),
        Some(RopeScaling::Linear { factor: 8.0 })
    );
    assert_eq!(
        parse(
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
        )
        .ok(),
        Some(llama31())
    );
    // YaRN without a factor stretches the original context to the model's.
    match parse(json!({"type": "yarn", "original_max_position_embeddings": 1024})) {
        Ok(RopeScaling::Yarn(y)) => assert_eq!((y.factor, y.original_context), (4.0, 1024.0)),
        other => panic!("{other:?}"),
    }
    // DeepSeek's mscale pair.
    match parse(json!({"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0})) {
        Ok(RopeScaling::Yarn(y)) => assert_eq!(y.attention_factor, 1.0),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_or_incomplete_schemes_are_refused_by_name() {
    for (v, needle) in [
        (json!({"rope_type": "dynamic", "factor": 2.0}), "'dynamic'"),
        (
            json!({"rope_type": "longrope", "short_factor": []}),
            "'longrope'",
        ),
        (json!({"rope_type": "linear"}), "'factor'"),
        (
            json!({"rope_type": "llama3", "factor": 8.0}),
            "'low_freq_factor'",
        ),
        (
            json!({"rope_type": "linear", "factor": "8"}),
            "rope_scaling.factor",
        ),
        (
            json!({"type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}),
            "partial",
        ),
        (json!([1, 2]), "expected an object"),
    ] {
        match RopeScaling::from_hf(&v, "rope_scaling", 4096) {
            Err(EngineError::Config(m)) => assert!(m.contains(needle), "{v}: {m}"),
            other => panic!("{v}: {other:?}"),
        }
    }
    for (scaling, needle) in [
        (RopeScaling::Linear { factor: 0.0 }, "factor"),
        (
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 4.0,
                high_freq_factor: 1.0,
                original_context: 8192.0,
            },
            "high_freq_factor",
        ),
        (RopeScaling::FreqFactors(vec![1.0; 3]), "needs 64"),
        (
            RopeScaling::FreqFactors(vec![f32::NAN; 64]),
            "frequency factor",
        ),
    ] {
        let err = scaling.validate(128).expect_err("invalid");
        assert!(err.contains(needle), "{err}");
    }
}

fn gguf(entries: &[(&str, Value)]) -> HashMap<String, Value> {
    entries
        .iter()
        .map(|(k, v)| (format!("qwen3.rope.{k}"), v.clone()))
        .collect()
}

#[test]
fn gguf_keys_as_llama_cpp_reads_them() {
    let yarn = gguf(&[
        ("scaling.type", Value::String("yarn".into())),
        ("scaling.factor", Value::F32(4.0)),
        ("scaling.original_context_length", Value::U32(32768)),
    ]);
    match RopeScaling::from_gguf(&yarn, "qwen3", None) {
        Ok(RopeScaling::Yarn(y)) => {
            assert_eq!((y.factor, y.original_context), (4.0, 32768.0));
            assert!((y.attention_factor - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-15);
        }
        other => panic!("{other:?}"),
    }
    let linear = gguf(&[
        ("scaling.type", Value::String("linear".into())),
        ("scaling.factor", Value::F32(8.0)),
    ]);
    assert_eq!(
        RopeScaling::from_gguf(&linear, "qwen3", None).ok(),
        Some(RopeScaling::Linear { factor: 8.0 })
    );
    let old = gguf(&[("scale_linear", Value::F32(2.0))]);
    assert_eq!(
        RopeScaling::from_gguf(&old, "qwen3", None).ok(),
        Some(RopeScaling::Linear { factor: 2.0 })
    );
    assert_eq!(
        RopeScaling::from_gguf(&gguf(&[]), "qwen3", Some(vec![1.0, 8.0])).ok(),
        Some(RopeScaling::FreqFactors(vec![1.0, 8.0]))
    );
    for (md, factors, needle) in [
        (
            linear.clone(),
            Some(vec![1.0]),
            "rope_freqs.weight together",
        ),
        (
            gguf(&[("scaling.type", Value::String("longrope".into()))]),
            None,
            "'longrope'",
        ),
        (
            gguf(&[
                ("scaling.type", Value::String("yarn".into())),
                ("scaling.factor", Value::F32(4.0)),
            ]),
            None,
            "original_context_length",
        ),
        (
            gguf(&[("scaling.type", Value::String("linear".into()))]),
            None,
            "scaling.factor",
        ),
        (
            gguf(&[("scaling.yarn_log_multiplier", Value::F32(0.1))]),
            None,
            "yarn_log_multiplier",
        ),
    ] {
        match RopeScaling::from_gguf(&md, "qwen3", factors) {
            Err(EngineError::Config(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{needle}: {other:?}"),
        }
    }
}
