//! GGUF metadata read into a [`ModelConfig`], as llama.cpp reads the same keys: the
//! family its `general.architecture` names, what every family reads alike (sizes, RoPE,
//! the experts its row says its files hold), the layer the row states, and then what only
//! the family reads.

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{EngineError, Result};
use crate::families::gguf_experts;
use crate::families::gguf_metadata::Gguf;
use crate::families::table;
use crate::spec::model::ModelConfig;
use crate::spec::rope::{RopeFactorTensors, RopeScaling};

/// The model a GGUF file describes, checked ([`ModelConfig::validate`]);
/// `rope_factors` are the values of its RoPE factor tensors, where it has them.
pub(crate) fn config_from_content(
    content: &Content,
    rope_factors: RopeFactorTensors,
) -> Result<ModelConfig> {
    let gguf = Gguf::new(content)?;
    let row = table::gguf_row(gguf.arch())?;
    let hidden = gguf.usize("embedding_length")?;
    let num_heads = gguf.usize("attention.head_count")?;
    let num_kv_heads = gguf.usize("attention.head_count_kv").unwrap_or(num_heads);
    let rotary = gguf.usize_opt("rope.dimension_count")?;
    let head_dim = gguf
        .usize("attention.key_length")
        .ok()
        .or(rotary)
        .unwrap_or(hidden / num_heads.max(1));
    let vocab_size = match gguf.usize("vocab_size") {
        Ok(v) => v,
        Err(_) => match gguf.metadata().get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => tokens.len(),
            _ => return Err(EngineError::Config("vocabulary size unknown".into())),
        },
    };
    // GLM-4.5's files count their multi-token-prediction layers among the blocks (after
    // the others); they are read only for `mtp` speculation.
    let blocks = gguf.usize("block_count")?;
    let prediction_layers = gguf.usize_opt("nextn_predict_layers")?.unwrap_or(0);
    let Some(num_layers) = blocks.checked_sub(prediction_layers) else {
        return Err(EngineError::Config(format!(
            "{} {prediction_layers} exceeds {} {blocks}",
            gguf.key("nextn_predict_layers"),
            gguf.key("block_count")
        )));
    };
    let moe = match &row.gguf_experts {
        Some(experts) => experts.read(&gguf, num_layers)?,
        None => {
            gguf_experts::refuse(&gguf)?;
            None
        }
    };
    // A model whose every layer is a mixture need not state a dense MLP width.
    let intermediate_size = match (gguf.usize("feed_forward_length"), &moe) {
        (Ok(n), _) => n,
        (Err(_), Some(m)) if !m.layers.contains(&false) => m.intermediate_size,
        (Err(e), _) => return Err(e),
    };
    let mut config = ModelConfig {
        family: row.family,
        vocab_size,
        hidden_size: hidden,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rotary_dim: rotary.unwrap_or(head_dim),
        rms_norm_eps: f64::from(gguf.f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5)),
        rope_theta: gguf.f32("rope.freq_base").unwrap_or(10_000.0),
        rope_scaling: RopeScaling::from_gguf(gguf.metadata(), gguf.arch(), rope_factors)?,
        rope_style: row.gguf_rope_style,
        max_position_embeddings: gguf.usize("context_length").unwrap_or(4096),
        moe,
        prediction_layers,
        ..ModelConfig::default()
    };
    row.layer.apply(&mut config);
    (row.from_gguf)(&gguf, &mut config)?;
    config.validate()?;
    Ok(config)
}

/// A file's header with `arch`'s keys of a model of `layers` layers of hidden 5376 over
/// 32 heads of 128 (Gemma 3 27B's shape; hidden / heads is 168), a window of 1024 and a
/// vocabulary of 262144, and no tensors.
#[cfg(test)]
pub(super) fn test_file(arch: &str, layers: u32) -> Content {
    use candle_core::quantized::gguf_file::VersionedMagic;
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
        tensor_infos: std::collections::HashMap::new(),
        tensor_data_offset: 0,
    }
}
