//! Tests of reading a Hugging Face `config.json` (`hf_config.rs`).

use super::*;
use serde_json::json;

/// The config.json `base` with the keys of `extra` added or replaced, read as
/// Tessera reads it.
fn read(mut base: serde_json::Value, extra: serde_json::Value) -> Result<ModelConfig> {
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    serde_json::from_value::<HfConfig>(base)
        .map_err(|e| EngineError::Config(e.to_string()))?
        .into_model_config()
}

/// Phi-3-mini-4k's shape: a window of 2047 positions in every layer.
fn phi3(extra: serde_json::Value) -> Result<ModelConfig> {
    read(
        json!({
            "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064,
            "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32,
            "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0, "rope_scaling": null, "sliding_window": 2047,
        }),
        extra,
    )
}

#[test]
fn phi3_attends_within_its_window_and_rotates_whole_heads() -> Result<()> {
    let c = phi3(json!({}))?;
    assert_eq!((c.architecture.as_str(), c.head_dim), ("phi3", 96));
    let window = c.sliding_window.expect("window");
    assert_eq!(window.window, 2047);
    assert!(window.layers.iter().all(|l| *l));
    // Phi-4: no window.
    assert!(phi3(json!({"sliding_window": null}))?
        .sliding_window
        .is_none());
    assert_eq!(c.rotary_dim, 96);
    // A share of the head that leaves an odd number of dimensions is refused.
    match phi3(json!({"partial_rotary_factor": 0.7})) {
        Err(EngineError::Config(m)) => assert!(m.contains("partial_rotary_factor"), "{m}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

/// Phi-4-mini's config.json (transformers-4 layout): three quarters of each head of 128
/// rotate, with LongRoPE factors for those 48 pairs over a pretraining context of 4096
/// stretched to 131072.
#[test]
fn phi4_mini_rotates_part_of_each_head_with_longrope() -> Result<()> {
    let factors = |v: f64| json!(vec![v; 48]);
    let c = phi3(json!({
        "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "partial_rotary_factor": 0.75,
        "sliding_window": 262144,
        "rope_scaling": {"type": "longrope", "long_factor": factors(2.0),
                         "short_factor": factors(1.0)},
    }))?;
    assert_eq!((c.head_dim, c.rotary_dim), (128, 96));
    let RopeScaling::LongRope(l) = &c.rope_scaling else {
        panic!("{:?}", c.rope_scaling)
    };
    assert_eq!(l.original_context, 4096.0);
    // sqrt(1 + ln(32) / ln(4096)), as transformers computes it.
    assert!((l.attention_factor - (1.0f64 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-12);
    assert!(c.sliding_window.is_none());
    // transformers 5 keeps the share and the pretraining context in rope_parameters.
    let t5 = phi3(json!({
        "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "original_max_position_embeddings": null, "rope_theta": null,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.75,
                            "original_max_position_embeddings": 4096,
                            "long_factor": factors(2.0), "short_factor": factors(1.0)},
    }))?;
    assert_eq!((t5.rotary_dim, &t5.rope_scaling), (96, &c.rope_scaling));
    // Factors for the whole head are refused by name.
    match phi3(json!({
        "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
        "partial_rotary_factor": 0.75, "rope_scaling": {"type": "longrope", "long_factor": factors(2.0),
                         "short_factor": vec![1.0; 64]},
    })) {
        Err(EngineError::Config(m)) => assert!(m.contains("short_factor holds 64"), "{m}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

/// Granite 3's scalars are read; absent, each is transformers' default of 1 (the
/// attention scores too: 1, not 1/√head_dim).
#[test]
fn granite_scalars_and_their_defaults() -> Result<()> {
    let granite = |extra: serde_json::Value| {
        read(
            json!({
                "model_type": "granite", "vocab_size": 49155, "hidden_size": 2048,
                "intermediate_size": 8192, "num_hidden_layers": 40,
                "num_attention_heads": 32, "num_key_value_heads": 8,
            }),
            extra,
        )
    };
    let c = granite(json!({
        "embedding_multiplier": 12.0, "attention_multiplier": 0.015625,
        "residual_multiplier": 0.22, "logits_scaling": 8.0,
    }))?;
    assert_eq!(
        (
            c.embed_scale,
            c.attention_scale,
            c.residual_multiplier,
            c.logits_scaling
        ),
        (Some(12.0), Some(0.015625), Some(0.22), Some(8.0))
    );
    assert_eq!(
        (c.rope_style, c.tie_word_embeddings),
        (RopeStyle::Half, false)
    );
    let plain = granite(json!({}))?;
    assert_eq!(
        (
            plain.embed_scale,
            plain.attention_scale,
            plain.residual_multiplier
        ),
        (Some(1.0), Some(1.0), Some(1.0))
    );
    match granite(json!({"residual_multiplier": -1.0})) {
        Err(EngineError::Config(m)) => assert!(m.contains("residual multiplier"), "{m}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn smollm3_layers_without_rope() -> Result<()> {
    let smollm3 = |extra: serde_json::Value| {
        read(
            json!({
                "model_type": "smollm3", "vocab_size": 512, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
            }),
            extra,
        )
    };
    let every_fourth = [false, false, false, true, false, false, false, true];
    let c = smollm3(json!({}))?;
    assert_eq!(c.nope_layers, every_fourth);
    // transformers' default for the family: a tied head.
    assert!(c.tie_word_embeddings);
    let listed = smollm3(json!({"no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0]}))?;
    assert_eq!(
        listed.nope_layers,
        [false, true, false, false, false, false, false, true]
    );
    match smollm3(json!({"no_rope_layers": [1, 0]})) {
        Err(EngineError::Config(m)) => assert!(m.contains("no_rope_layers"), "{m}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn gemma2_caps_alternate_windows_and_gemma3_refuses_caps() -> Result<()> {
    let gemma = |model_type: &str, extra: serde_json::Value| {
        read(
            json!({
                "model_type": model_type, "vocab_size": 512, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 8,
            }),
            extra,
        )
    };
    // Absent: transformers' defaults.
    let c = gemma("gemma2", json!({}))?;
    assert_eq!(
        (c.attn_logit_softcapping, c.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
    assert!(!c.qk_norm);
    let window = c.sliding_window.expect("window");
    assert_eq!(window.layers, [true, false, true, false]);
    assert_eq!(window.rope_theta, c.rope_theta);
    // null: no cap.
    let c = gemma(
        "gemma2",
        json!({"attn_logit_softcapping": null, "final_logit_softcapping": 10.0}),
    )?;
    assert_eq!(
        (c.attn_logit_softcapping, c.final_logit_softcapping),
        (None, Some(10.0))
    );
    assert!(gemma("gemma3_text", json!({}))?.qk_norm);
    match gemma("gemma3_text", json!({"final_logit_softcapping": 30.0})) {
        Err(EngineError::Config(m)) => assert!(m.contains("final_logit_softcapping"), "{m}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn rope_parameters_and_rope_scaling_are_both_read() -> Result<()> {
    let llama = |extra: serde_json::Value| {
        read(
            json!({
                "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            }),
            extra,
        )
    };
    let v5 = llama(
        json!({"rope_parameters": {"rope_type": "linear", "factor": 2.0,
        "rope_theta": 5e5}}),
    )?;
    assert_eq!(
        (v5.rope_theta, v5.rope_scaling),
        (5e5, RopeScaling::Linear { factor: 2.0 })
    );
    let v4 = llama(json!({"rope_theta": 5e5, "rope_scaling": {"type": "linear",
        "factor": 4.0}}))?;
    assert_eq!(
        (v4.rope_theta, v4.rope_scaling),
        (5e5, RopeScaling::Linear { factor: 4.0 })
    );
    Ok(())
}
