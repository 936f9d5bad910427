//! GGUF files: metadata to [`ModelConfig`], tensors by canonical name, raw blocks kept.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};

use crate::config::{
    gemma3_sliding_layers, gguf_rope_style, Activation, ModelConfig, SlidingWindow,
    GEMMA3_SLIDING_PATTERN,
};
use crate::error::{EngineError, Result};
use crate::loader::gguf_header::{read_gguf_header, tensor_bytes};
use crate::loader::{Embedding, Matrix, TensorSource};

/// An open GGUF file. Tensor data is read on demand.
pub struct GgufSource {
    path: PathBuf,
    file: File,
    content: Content,
    config: ModelConfig,
}

/// A GGUF header checked against the file: every tensor lies inside it, and the metadata
/// describes a model Tessera can run.
pub struct GgufHeader {
    pub content: Content,
    pub config: ModelConfig,
}

impl GgufHeader {
    /// Reads and checks the header of the GGUF file in `reader`. The error is a message
    /// for the user; nothing the file claims is allocated before it is checked.
    pub fn read<R: Read + Seek>(reader: &mut R) -> std::result::Result<Self, String> {
        let content =
            read_gguf_header(reader).map_err(|e| format!("not a valid GGUF file: {e}"))?;
        let mut config = config_from_metadata(&content.metadata).map_err(|e| e.to_string())?;
        config.tie_word_embeddings = !content.tensor_infos.contains_key("output.weight");
        if content.tensor_infos.contains_key("rope_freqs.weight") {
            return Err("rope frequency scaling (rope_freqs.weight) is not supported yet".into());
        }
        Ok(GgufHeader { content, config })
    }
}

impl GgufSource {
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |message: String| EngineError::BadFile {
            path: path.to_path_buf(),
            message,
        };
        let mut file = File::open(path).map_err(|e| bad(e.to_string()))?;
        let GgufHeader { content, config } = GgufHeader::read(&mut file).map_err(bad)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
            config,
        })
    }

    /// The file's metadata (tokenizer, chat template, ...).
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn raw(&self, gguf_name: &str, canonical: &str) -> Result<(GgmlDType, Vec<usize>, Vec<u8>)> {
        let info = self
            .content
            .tensor_infos
            .get(gguf_name)
            .ok_or_else(|| EngineError::MissingTensor(format!("{gguf_name} ({canonical})")))?;
        let dtype = info.ggml_dtype;
        check_supported(dtype, gguf_name)?;
        // The header reader checked that every tensor's data lies inside the file.
        let len = tensor_bytes(info).unwrap_or(0) as usize;
        let mut data = vec![0u8; len];
        self.file
            .read_exact_at(&mut data, self.content.tensor_data_offset + info.offset)?;
        Ok((dtype, info.shape.dims().to_vec(), data))
    }
}

fn check_supported(dtype: GgmlDType, name: &str) -> Result<()> {
    match dtype {
        GgmlDType::F32
        | GgmlDType::F16
        | GgmlDType::BF16
        | GgmlDType::Q4_0
        | GgmlDType::Q4_1
        | GgmlDType::Q5_0
        | GgmlDType::Q5_1
        | GgmlDType::Q8_0
        | GgmlDType::Q2K
        | GgmlDType::Q3K
        | GgmlDType::Q4K
        | GgmlDType::Q5K
        | GgmlDType::Q6K => Ok(()),
        other => Err(EngineError::UnsupportedQuantization {
            name: name.to_string(),
            dtype: format!("{other:?}"),
        }),
    }
}

/// Maps a canonical (Hugging Face) tensor name to its GGUF name.
pub fn gguf_name(canonical: &str) -> Option<String> {
    let fixed = match canonical {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.to_string());
    }
    let rest = canonical.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let mapped = match suffix {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{mapped}"))
}

/// The GGUF name of `canonical` in a file of architecture `arch`: gemma's layers have
/// four norms, and its `post_attention_layernorm` is the one after attention, not the
/// MLP's input norm that llama's name means.
fn resolve(arch: &str, canonical: &str) -> Result<String> {
    let gemma = if arch == "gemma3" {
        canonical
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(layer, suffix)| {
                let mapped = match suffix {
                    "post_attention_layernorm.weight" => "post_attention_norm.weight",
                    "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
                    "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
                    _ => return None,
                };
                Some(format!("blk.{layer}.{mapped}"))
            })
    } else {
        None
    };
    gemma
        .or_else(|| gguf_name(canonical))
        .ok_or_else(|| EngineError::MissingTensor(canonical.to_string()))
}

impl TensorSource for GgufSource {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn matrix(&self, name: &str) -> Result<Matrix> {
        let gname = resolve(&self.config.architecture, name)?;
        let (dtype, dims, data) = self.raw(&gname, name)?;
        let [rows, cols] = dims[..] else {
            return Err(EngineError::ShapeMismatch {
                name: gname,
                expected: vec![0, 0],
                found: dims,
            });
        };
        match dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                    dtype,
                    &data,
                    vec![rows, cols],
                    &Device::Cpu,
                )?;
                Ok(Matrix::Dense {
                    name: gname,
                    weight: q.dequantize(&Device::Cpu)?,
                })
            }
            _ => Ok(Matrix::Quantized {
                name: gname,
                dtype,
                rows,
                cols,
                data: Arc::new(data),
            }),
        }
    }

    fn vector(&self, name: &str) -> Result<Tensor> {
        let gname = resolve(&self.config.architecture, name)?;
        let (dtype, dims, data) = self.raw(&gname, name)?;
        let q =
            candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, &data, dims, &Device::Cpu)?;
        Ok(q.dequantize(&Device::Cpu)?.flatten_all()?)
    }

    fn contains(&self, name: &str) -> bool {
        resolve(&self.config.architecture, name)
            .is_ok_and(|g| self.content.tensor_infos.contains_key(&g))
    }

    fn block_cols(&self, name: &str) -> Result<usize> {
        let gname = resolve(&self.config.architecture, name)?;
        let info = self
            .content
            .tensor_infos
            .get(&gname)
            .ok_or_else(|| EngineError::MissingTensor(format!("{gname} ({name})")))?;
        Ok(match info.ggml_dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => 1,
            other => other.block_size(),
        })
    }

    fn embedding(&self) -> Result<Embedding> {
        let name = "model.embed_tokens.weight";
        let gname = resolve(&self.config.architecture, name)?;
        let (dtype, dims, data) = self.raw(&gname, name)?;
        let q =
            candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, &data, dims, &Device::Cpu)?;
        match dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                Ok(Embedding::Dense(q.dequantize(&Device::Cpu)?))
            }
            _ => Ok(Embedding::Quantized(Arc::new(q))),
        }
    }
}

fn meta<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a Value> {
    md.get(key)
        .ok_or_else(|| EngineError::Config(format!("missing metadata key '{key}'")))
}

fn meta_usize(md: &HashMap<String, Value>, key: &str) -> Result<usize> {
    let v = meta(md, key)?;
    let n = v
        .to_u64()
        .or_else(|_| v.to_u32().map(u64::from))
        .or_else(|_| v.to_i32().map(|x| x.max(0) as u64))
        .map_err(|e| EngineError::Config(format!("metadata '{key}': {e}")))?;
    Ok(n as usize)
}

fn meta_f32(md: &HashMap<String, Value>, key: &str) -> Result<f32> {
    meta(md, key)?
        .to_f32()
        .map_err(|e| EngineError::Config(format!("metadata '{key}': {e}")))
}

/// Gemma 3 as llama.cpp writes and reads it: norm weights with the 1 already added,
/// embeddings scaled by √hidden, GELU (tanh) MLP, per-head q/k norms, and every sixth layer
/// global, the others sliding-window layers with a RoPE base of 10000.
fn gemma3_config(md: &HashMap<String, Value>, mut config: ModelConfig) -> Result<ModelConfig> {
    let window = meta_usize(md, "gemma3.attention.sliding_window")?;
    config.set_gemma3_layers(SlidingWindow {
        window,
        layers: gemma3_sliding_layers(config.num_layers, GEMMA3_SLIDING_PATTERN),
        rope_theta: GEMMA3_SLIDING_ROPE_THETA,
    });
    Ok(config)
}

/// RoPE base of gemma 3's sliding-window layers (not stored in its GGUF files).
const GEMMA3_SLIDING_ROPE_THETA: f32 = 10_000.0;

fn config_from_metadata(md: &HashMap<String, Value>) -> Result<ModelConfig> {
    let arch = meta(md, "general.architecture")?
        .to_string()
        .map_err(|e| EngineError::Config(e.to_string()))?
        .clone();
    let rope_style = gguf_rope_style(&arch)?;
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = meta_usize(md, &key("embedding_length"))?;
    let num_heads = meta_usize(md, &key("attention.head_count"))?;
    let num_kv_heads = meta_usize(md, &key("attention.head_count_kv")).unwrap_or(num_heads);
    let head_dim = meta_usize(md, &key("attention.key_length"))
        .or_else(|_| meta_usize(md, &key("rope.dimension_count")))
        .unwrap_or(hidden / num_heads.max(1));
    let vocab_size = match meta_usize(md, &key("vocab_size")) {
        Ok(v) => v,
        Err(_) => match md.get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => tokens.len(),
            _ => return Err(EngineError::Config("vocabulary size unknown".into())),
        },
    };
    let config = ModelConfig {
        architecture: arch.clone(),
        vocab_size,
        hidden_size: hidden,
        intermediate_size: meta_usize(md, &key("feed_forward_length"))?,
        num_layers: meta_usize(md, &key("block_count"))?,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: f64::from(
            meta_f32(md, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        ),
        rope_theta: meta_f32(md, &key("rope.freq_base")).unwrap_or(10_000.0),
        rope_style,
        max_position_embeddings: meta_usize(md, &key("context_length")).unwrap_or(4096),
        attention_bias: arch == "qwen2",
        qk_norm: arch == "qwen3",
        sandwich_norms: false,
        norm_weight_offset: 0.0,
        embed_scale: None,
        attention_scale: None,
        activation: Activation::Silu,
        sliding_window: None,
        tie_word_embeddings: false,
        moe: None,
    };
    let config = if arch == "gemma3" {
        gemma3_config(md, config)?
    } else {
        config
    };
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::gguf_name;

    #[test]
    fn canonical_names_map_to_gguf() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.o_proj.weight").as_deref(),
            Some("blk.12.attn_output.weight")
        );
        assert_eq!(
            gguf_name("lm_head.weight").as_deref(),
            Some("output.weight")
        );
        assert_eq!(gguf_name("model.layers.x"), None);
    }
}

#[cfg(test)]
mod dtype_tests {
    use super::*;

    #[test]
    fn activation_only_types_are_refused_by_name() {
        let err = check_supported(GgmlDType::Q8_1, "blk.0.attn_q.weight")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("tensor 'blk.0.attn_q.weight' uses quantization Q8_1, which Tessera does not support")
        );
        assert!(check_supported(GgmlDType::Q4_1, "w").is_ok());
    }
}
