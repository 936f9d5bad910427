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
    let plain = RopeScaling::None.inv_freq(128, 500_000.0, 8192);
    let scaled = llama31().inv_freq(128, 500_000.0, 8192);
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
    let from_file = RopeScaling::FreqFactors(factors).inv_freq(128, 500_000.0, 8192);
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
        None,
    )
    .expect("yarn");
    let plain = RopeScaling::None.inv_freq(32, 1e6, 8192);
    let f = yarn.inv_freq(32, 1e6, 8192);
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
    let parse = |v: serde_json::Value| RopeScaling::from_hf(&v, "rope_scaling", 4096, None);
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
            "needs a list 'long_factor'",
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
        (json!([1, 2]), "expected an object"),
    ] {
        match RopeScaling::from_hf(&v, "rope_scaling", 4096, None) {
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
        (RopeScaling::FreqFactors(vec![1.0; 3]), "need 64"),
        (
            RopeScaling::FreqFactors(vec![f32::NAN; 64]),
            "frequency factor",
        ),
        (
            RopeScaling::LongRope(LongRope {
                short_factor: vec![1.0; 64],
                long_factor: vec![0.0; 64],
                original_context: 4096.0,
                attention_factor: 1.0,
            }),
            "long_factor 0 must be positive",
        ),
    ] {
        let err = scaling.validate(128).expect_err("invalid");
        assert!(err.contains(needle), "{err}");
    }
}

/// LongRoPE as Phi-3.5 and Phi-4-mini ship it: the short factors within the pretraining
/// context, the long ones past it, chosen once for the context a model is served with.
#[test]
fn longrope_divides_by_the_factors_of_the_served_context() {
    let l = RopeScaling::from_hf(
        &json!({"type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [4.0, 8.0]}),
        "rope_scaling",
        131072,
        Some(4096),
    )
    .expect("longrope");
    let plain = RopeScaling::None.inv_freq(4, 10_000.0, 4096);
    let within = l.inv_freq(4, 10_000.0, 4096);
    let beyond = l.inv_freq(4, 10_000.0, 4097);
    assert!(close(&within, &[plain[0], plain[1] / 2.0]), "{within:?}");
    assert!(
        close(&beyond, &[plain[0] / 4.0, plain[1] / 8.0]),
        "{beyond:?}"
    );
    // sqrt(1 + ln(131072 / 4096) / ln(4096)), whichever factors run.
    let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
    assert!((l.attention_factor() - want).abs() < 1e-15);
    // "su", Phi-3's first name for it; a given attention factor is kept.
    let su = RopeScaling::from_hf(
        &json!({"type": "su", "short_factor": [1.0, 1.0], "long_factor": [1.0, 1.0],
                "attention_factor": 1.25}),
        "rope_scaling",
        8192,
        Some(4096),
    )
    .expect("su");
    assert_eq!(su.attention_factor(), 1.25);
}

/// A phi3 GGUF file as llama.cpp's converter writes LongRoPE: the two factor tensors, the
/// pretraining context and the attention factor, with no scaling type.
#[test]
fn gguf_longrope_as_llama_cpp_writes_it() {
    let mut md: HashMap<String, Value> = [
        (
            "phi3.rope.scaling.original_context_length",
            Value::U32(4096),
        ),
        ("phi3.rope.scaling.attn_factor", Value::F32(1.25)),
        ("phi3.context_length", Value::U32(131072)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let tensors = || RopeFactorTensors {
        freqs: None,
        long: Some(vec![4.0, 8.0]),
        short: Some(vec![1.0, 2.0]),
    };
    match RopeScaling::from_gguf(&md, "phi3", tensors()) {
        Ok(RopeScaling::LongRope(l)) => {
            assert_eq!(
                (l.short_factor, l.long_factor),
                (vec![1.0, 2.0], vec![4.0, 8.0])
            );
            assert_eq!((l.original_context, l.attention_factor), (4096.0, 1.25));
        }
        other => panic!("{other:?}"),
    }
    // Without the attention factor: computed from the context, as the converter does.
    md.remove("phi3.rope.scaling.attn_factor");
    let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
    let scaling = RopeScaling::from_gguf(&md, "phi3", tensors()).expect("longrope");
    assert!((scaling.attention_factor() - want).abs() < 1e-6);
    // Without the pretraining context it is refused by name.
    md.remove("phi3.rope.scaling.original_context_length");
    match RopeScaling::from_gguf(&md, "phi3", tensors()) {
        Err(EngineError::Config(m)) => assert!(m.contains("original_context_length"), "{m}"),
        other => panic!("{other:?}"),
    }
}

fn freqs(factors: Vec<f32>) -> RopeFactorTensors {
    RopeFactorTensors {
        freqs: Some(factors),
        ..RopeFactorTensors::default()
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
    match RopeScaling::from_gguf(&yarn, "qwen3", RopeFactorTensors::default()) {
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
        RopeScaling::from_gguf(&linear, "qwen3", RopeFactorTensors::default()).ok(),
        Some(RopeScaling::Linear { factor: 8.0 })
    );
    let old = gguf(&[("scale_linear", Value::F32(2.0))]);
    assert_eq!(
        RopeScaling::from_gguf(&old, "qwen3", RopeFactorTensors::default()).ok(),
        Some(RopeScaling::Linear { factor: 2.0 })
    );
    assert_eq!(
        RopeScaling::from_gguf(&gguf(&[]), "qwen3", freqs(vec![1.0, 8.0])).ok(),
        Some(RopeScaling::FreqFactors(vec![1.0, 8.0]))
    );
    for (md, factors, needle) in [
        (
            linear.clone(),
            freqs(vec![1.0]),
            "rope_freqs.weight together",
        ),
        (
            gguf(&[("scaling.type", Value::String("longrope".into()))]),
            RopeFactorTensors::default(),
            "needs both rope_factors_long.weight",
        ),
        (
            gguf(&[("scaling.type", Value::String("dynamic".into()))]),
            RopeFactorTensors::default(),
            "'dynamic'",
        ),
        (
            gguf(&[
                ("scaling.type", Value::String("yarn".into())),
                ("scaling.factor", Value::F32(4.0)),
            ]),
            RopeFactorTensors::default(),
            "original_context_length",
        ),
        (
            gguf(&[("scaling.type", Value::String("linear".into()))]),
            RopeFactorTensors::default(),
            "scaling.factor",
        ),
        (
            gguf(&[("scaling.yarn_log_multiplier", Value::F32(0.1))]),
            RopeFactorTensors::default(),
            "yarn_log_multiplier",
        ),
    ] {
        match RopeScaling::from_gguf(&md, "qwen3", factors) {
            Err(EngineError::Config(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{needle}: {other:?}"),
        }
    }
}
