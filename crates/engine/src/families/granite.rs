//! Granite (`GraniteForCausalLM`; GGUF `granite`): llama's layer with four scalars:
//! embeddings multiplied, attention scores multiplied (in place of 1/√head_dim), each
//! half's output multiplied before it joins the residual stream, and the logits divided.

use crate::error::Result;
use crate::families::gguf_metadata::Gguf;
use crate::families::hf_config::HfConfig;
use crate::families::row::{HfDefaults, Layer, Row};
use crate::spec::family::{Family, TensorNames};
use crate::spec::model::{ModelConfig, RopeStyle};

static GRANITE: Family = Family {
    name: "granite",
    hf_names: &["granite", "GraniteForCausalLM"],
    gguf_names: &["granite"],
    tensors: TensorNames::LLAMA,
    quantizations: &[],
};

pub(super) static ROW: Row = Row {
    family: &GRANITE,
    layer: Layer::LLAMA,
    hf_rope_style: RopeStyle::Half,
    gguf_rope_style: RopeStyle::Interleaved,
    hf_defaults: HfDefaults::LLAMA,
    gguf_experts: None,
    from_hf,
    from_gguf,
    fixture: "tiny-granite",
};

/// transformers multiplies by each (the attention scores by the attention multiplier in
/// place of 1/√head_dim), 1 where the config has none.
fn from_hf(hf: &HfConfig, config: &mut ModelConfig) -> Result<()> {
    config.embed_scale = Some(hf.embedding_multiplier.unwrap_or(1.0));
    config.attention_scale = Some(hf.attention_multiplier.unwrap_or(1.0));
    config.residual_multiplier = Some(hf.residual_multiplier.unwrap_or(1.0));
    config.logits_scaling = Some(hf.logits_scaling.unwrap_or(1.0));
    Ok(())
}

/// As llama.cpp reads them: each applies where the file has it and it is not 0 (without
/// `attention.scale`, scores scale by 1/√head_dim).
fn from_gguf(gguf: &Gguf<'_>, config: &mut ModelConfig) -> Result<()> {
    let scalar = |k: &str| -> Result<Option<f32>> { Ok(gguf.f32_opt(k)?.filter(|v| *v != 0.0)) };
    config.embed_scale = scalar("embedding_scale")?;
    config.attention_scale = scalar("attention.scale")?;
    config.residual_multiplier = scalar("residual_scale")?;
    config.logits_scaling = scalar("logit_scale")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EngineError;
    use crate::families::gguf::{config_from_content, test_file};
    use crate::spec::rope::RopeFactorTensors;
    use candle_core::quantized::gguf_file::Value;
    use serde_json::json;

    /// Granite 3's scalars are read; absent, each is transformers' default of 1 (the
    /// attention scores too: 1, not 1/√head_dim).
    #[test]
    fn granite_scalars_and_their_defaults() -> Result<()> {
        let granite = |extra: serde_json::Value| {
            crate::families::hf::read(
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

    /// A granite file without its scalars runs as llama.cpp runs it: nothing scaled, and
    /// scores by 1/√head_dim; a 0 means none too.
    #[test]
    fn granite_scalars_absent_or_zero_scale_nothing() -> Result<()> {
        let mut file = test_file("granite", 4);
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
}
