//! Tests of `gguf.rs`: GGUF metadata read as llama.cpp reads it.

use super::*;
use candle_core::quantized::gguf_file::VersionedMagic;

/// A gemma file's metadata: `layers` layers of hidden 5376 over 32 heads of 128 (Gemma
/// 3 27B's shape; hidden / heads is 168).
fn gemma(arch: &str, layers: u32) -> Content {
    let key = |k: &str| format!("{arch}.{k}");
    let metadata = [
        (key("embedding_length"), Value::U32(5376)),
        (key("feed_forward_length"), Value::U32(21504)),
        (key("block_count"), Value::U32(layers)),
        (key("attention.head_count"), Value::U32(32)),
        (key("attention.head_count_kv"), Value::U32(16)),
        (key("attention.key_length"), Value::U32(128)),
        (key("attention.sliding_window"), Value::U32(1024)),
        (key("vocab_size"), Value::U32(262144)),
        (
            "general.architecture".to_string(),
            Value::String(arch.into()),
        ),
    ]
    .into_iter()
    .collect();
    Content {
        magic: VersionedMagic::GgufV3,
        metadata,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    }
}

#[test]
fn gemma_27b_files_scale_scores_by_hidden_over_heads_as_llama_cpp() -> Result<()> {
    let by_hidden = Some(1.0 / 168f32.sqrt());
    assert_eq!(
        config_from_content(&gemma("gemma3", 62), RopeFactorTensors::default())?.attention_scale,
        by_hidden
    );
    assert_eq!(
        config_from_content(&gemma("gemma2", 46), RopeFactorTensors::default())?.attention_scale,
        by_hidden
    );
    // Other sizes: 1/√head_dim.
    assert_eq!(
        config_from_content(&gemma("gemma3", 34), RopeFactorTensors::default())?.attention_scale,
        None
    );
    Ok(())
}

#[test]
fn gemma2_files_cap_at_llama_cpp_defaults_unless_they_say() -> Result<()> {
    let c = config_from_content(&gemma("gemma2", 26), RopeFactorTensors::default())?;
    assert_eq!(
        (c.attn_logit_softcapping, c.final_logit_softcapping),
        (Some(50.0), Some(30.0))
    );
    assert!(!c.qk_norm);
    assert_eq!(
        c.sliding_window.map(|w| w.layers[..4].to_vec()),
        Some(vec![true, false, true, false])
    );
    let mut file = gemma("gemma2", 26);
    file.metadata
        .insert("gemma2.final_logit_softcapping".into(), Value::F32(0.0));
    let c = config_from_content(&file, RopeFactorTensors::default())?;
    assert_eq!(c.final_logit_softcapping, None);
    assert!(config_from_content(&gemma("gemma3", 26), RopeFactorTensors::default())?.qk_norm);
    Ok(())
}

/// A gpt-oss file as llama.cpp's converter writes gpt-oss-20b: a window in every other
/// layer, sinks, biases where its tensors are, YaRN without rounding, and experts with
/// biases and the clamp llama.cpp fixes.
#[test]
fn gpt_oss_files_read_as_the_model_is_defined() -> Result<()> {
    let mut file = gemma("gpt-oss", 4);
    for (k, v) in [
        ("gpt-oss.attention.sliding_window", Value::U32(128)),
        ("gpt-oss.attention.key_length", Value::U32(64)),
        ("gpt-oss.expert_count", Value::U32(32)),
        ("gpt-oss.expert_used_count", Value::U32(4)),
        ("gpt-oss.expert_feed_forward_length", Value::U32(2880)),
        ("gpt-oss.rope.scaling.type", Value::String("yarn".into())),
        ("gpt-oss.rope.scaling.factor", Value::F32(32.0)),
        (
            "gpt-oss.rope.scaling.original_context_length",
            Value::U32(4096),
        ),
        ("gpt-oss.context_length", Value::U32(131072)),
    ] {
        file.metadata.insert(k.into(), v);
    }
    let info = || candle_core::quantized::gguf_file::TensorInfo {
        ggml_dtype: candle_core::quantized::GgmlDType::F32,
        shape: candle_core::Shape::from(vec![32]),
        offset: 0,
    };
    for l in 0..4 {
        file.tensor_infos
            .insert(format!("blk.{l}.ffn_gate_inp.weight"), info());
    }
    file.tensor_infos.insert("blk.0.attn_q.bias".into(), info());
    let c = config_from_content(&file, RopeFactorTensors::default())?;
    assert!(c.attention_sinks && c.attention_bias && !c.attention_out_bias);
    assert_eq!(c.rope_style, crate::spec::model::RopeStyle::Half);
    let sw = c.sliding_window.expect("window");
    assert_eq!(
        (sw.window, sw.layers),
        (128, vec![true, false, true, false])
    );
    match &c.rope_scaling {
        RopeScaling::Yarn(y) => assert!(!y.truncate && y.factor == 32.0),
        other => panic!("{other:?}"),
    }
    let moe = c.moe.expect("experts");
    assert_eq!((moe.num_experts, moe.top_k), (32, 4));
    assert!(moe.biases && moe.norm_topk_prob);
    assert_eq!(moe.clamped_swiglu, Some(GPT_OSS_SWIGLU));
    // llama.cpp's gating value for a softmax over the chosen logits is accepted.
    file.metadata
        .insert("gpt-oss.expert_gating_func".into(), Value::U32(3));
    assert!(config_from_content(&file, RopeFactorTensors::default()).is_ok());
    Ok(())
}

/// A granite file without its scalars runs as llama.cpp runs it: nothing scaled, and
/// scores by 1/√head_dim; a 0 means none too.
#[test]
fn granite_scalars_absent_or_zero_scale_nothing() -> Result<()> {
    let mut file = gemma("granite", 4);
    let c = config_from_content(&file, RopeFactorTensors::default())?;
    assert_eq!(
        (
            c.embed_scale,
            c.attention_scale,
            c.residual_multiplier,
            c.logits_scaling
        ),
        (None, None, None, None)
    );
    assert_eq!(c.rope_style, crate::spec::model::RopeStyle::Interleaved);
    file.metadata
        .insert("granite.residual_scale".into(), Value::F32(0.22));
    file.metadata
        .insert("granite.logit_scale".into(), Value::F32(0.0));
    let c = config_from_content(&file, RopeFactorTensors::default())?;
    assert_eq!(
        (c.residual_multiplier, c.logits_scaling),
        (Some(0.22), None)
    );
    Ok(())
}
