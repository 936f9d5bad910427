//! GGUF metadata (and, for mixtures of experts, which layers hold a router) to
//! [`ModelConfig`], as llama.cpp reads the same keys.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{EngineError, Result};
use crate::families::gemma2::{
    gemma_sliding_layers, set_gemma_layers, GEMMA2_SLIDING_PATTERN, GEMMA3_SLIDING_PATTERN,
};
use crate::families::smollm3::{every_nth_layer, SMOLLM3_NOPE_INTERVAL};
use crate::spec::model::{ModelConfig, RopeStyle, SlidingWindow};
use crate::spec::moe::{ClampedSwiglu, ExpertNames, MoeConfig, MoeFields, SigmoidRouter};
use crate::spec::rope::{RopeFactorTensors, RopeScaling};

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

/// `key` where the file has it; a value of the wrong type is an error, not a default.
fn meta_usize_opt(md: &HashMap<String, Value>, key: &str) -> Result<Option<usize>> {
    md.contains_key(key)
        .then(|| meta_usize(md, key))
        .transpose()
}

fn meta_f32(md: &HashMap<String, Value>, key: &str) -> Result<f32> {
    meta(md, key)?
        .to_f32()
        .map_err(|e| EngineError::Config(format!("metadata '{key}': {e}")))
}

/// Gemma 2 and 3 as llama.cpp writes and reads them: norm weights with the 1 already
/// added, embeddings scaled by √hidden, GELU (tanh) MLP; Gemma 3 with per-head q/k norms
/// and every sixth layer global, the others sliding-window layers with a RoPE base of
/// 10000; Gemma 2 with every other layer global, all at the file's base, and its caps on
/// attention scores and final logits (llama.cpp's defaults, 50 and 30, where absent).
fn gemma_config(
    md: &HashMap<String, Value>,
    arch: &str,
    mut config: ModelConfig,
) -> Result<ModelConfig> {
    let key = |k: &str| format!("{arch}.{k}");
    let window = meta_usize(md, &key("attention.sliding_window"))?;
    let gemma2 = arch == "gemma2";
    if gemma2 {
        for (k, default, slot) in [
            (
                "attn_logit_softcapping",
                50.0,
                &mut config.attn_logit_softcapping,
            ),
            (
                "final_logit_softcapping",
                30.0,
                &mut config.final_logit_softcapping,
            ),
        ] {
            let cap = match md.contains_key(&key(k)) {
                true => meta_f32(md, &key(k))?,
                false => default,
            };
            *slot = (cap != 0.0).then_some(cap);
        }
    }
    // llama.cpp knows the 27B models by their layer count and scales their scores by
    // 1/√(hidden / heads), their query_pre_attn_scalar, instead of 1/√head_dim.
    if (gemma2 && config.num_layers == 46) || (arch == "gemma3" && config.num_layers == 62) {
        config.attention_scale =
            Some(1.0 / ((config.hidden_size / config.num_heads.max(1)) as f32).sqrt());
    }
    let sliding = if gemma2 {
        SlidingWindow {
            window,
            layers: gemma_sliding_layers(config.num_layers, GEMMA2_SLIDING_PATTERN),
            rope_theta: config.rope_theta,
            rope_scaling: config.rope_scaling.clone(),
        }
    } else {
        SlidingWindow {
            window,
            layers: gemma_sliding_layers(config.num_layers, GEMMA3_SLIDING_PATTERN),
            rope_theta: GEMMA3_SLIDING_ROPE_THETA,
            // As in llama.cpp, the file's scaling is the global layers'.
            rope_scaling: RopeScaling::None,
        }
    };
    set_gemma_layers(&mut config, sliding);
    Ok(config)
}

/// Granite's scalars as llama.cpp reads them: each applies where the file has it and it
/// is not 0 (without `attention.scale`, scores scale by 1/√head_dim).
fn granite_config(md: &HashMap<String, Value>, mut config: ModelConfig) -> Result<ModelConfig> {
    let scalar = |k: &str| -> Result<Option<f32>> {
        let key = format!("granite.{k}");
        match md.contains_key(&key) {
            true => Ok(Some(meta_f32(md, &key)?).filter(|v| *v != 0.0)),
            false => Ok(None),
        }
    };
    config.embed_scale = scalar("embedding_scale")?;
    config.attention_scale = scalar("attention.scale")?;
    config.residual_multiplier = scalar("residual_scale")?;
    config.logits_scaling = scalar("logit_scale")?;
    Ok(config)
}

/// gpt-oss's clamped gate, which llama.cpp fixes for gpt-oss files.
const GPT_OSS_SWIGLU: ClampedSwiglu = ClampedSwiglu {
    alpha: 1.702,
    limit: 7.0,
};

/// gpt-oss as llama.cpp's converter writes it: biases on every attention projection
/// (where the file has them), a sink logit per query head, and a window of
/// `attention.sliding_window` in every other layer, the first included. YaRN rotates as
/// OpenAI's models were trained, without rounding the ramp's ends (llama.cpp rounds them).
fn gpt_oss_config(
    content: &Content,
    md: &HashMap<String, Value>,
    mut config: ModelConfig,
) -> Result<ModelConfig> {
    config.attention_bias = content.tensor_infos.contains_key("blk.0.attn_q.bias");
    config.attention_out_bias = content.tensor_infos.contains_key("blk.0.attn_output.bias");
    config.attention_sinks = true;
    if let RopeScaling::Yarn(y) = &mut config.rope_scaling {
        y.truncate = false;
    }
    config.sliding_window = Some(SlidingWindow {
        window: meta_usize(md, "gpt-oss.attention.sliding_window")?,
        layers: gemma_sliding_layers(config.num_layers, GPT_OSS_SLIDING_PATTERN),
        rope_theta: config.rope_theta,
        rope_scaling: config.rope_scaling.clone(),
    });
    Ok(config)
}

/// OLMo 3 as llama.cpp's converter writes it (architecture `olmo2`): a window of
/// `attention.sliding_window` in the layers `attention.sliding_window_pattern` marks (by
/// default three of every four), which rotate plainly with `rope.freq_base_swa` (else
/// the file's base); the other layers keep the file's RoPE scaling (OLMo 3's YaRN). An
/// OLMo 2 file states no window.
fn olmo3_window(md: &HashMap<String, Value>, mut config: ModelConfig) -> Result<ModelConfig> {
    let Some(window) = meta_usize_opt(md, "olmo2.attention.sliding_window")?.filter(|w| *w > 0)
    else {
        return Ok(config);
    };
    let n = config.num_layers;
    let key = "olmo2.attention.sliding_window_pattern";
    let layers: Vec<bool> = match md.get(key) {
        Some(Value::Array(flags)) => flags
            .iter()
            .map(|f| {
                f.to_bool()
                    .map_err(|e| EngineError::Config(format!("metadata '{key}': {e}")))
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(EngineError::Config(format!(
                "metadata '{key}' is not an array"
            )))
        }
        None => (0..n)
            .map(|l| (l + 1) % OLMO3_FULL_LAYER_EVERY != 0)
            .collect(),
    };
    if layers.len() != n {
        return Err(EngineError::Config(format!(
            "metadata '{key}' lists {} layers of {n}",
            layers.len()
        )));
    }
    config.sliding_window = Some(SlidingWindow {
        window,
        layers,
        rope_theta: meta_f32(md, "olmo2.rope.freq_base_swa").unwrap_or(config.rope_theta),
        rope_scaling: RopeScaling::None,
    });
    Ok(config)
}

/// OLMo 3's default: every fourth layer attends to the whole context.
const OLMO3_FULL_LAYER_EVERY: usize = 4;

/// gpt-oss alternates a sliding-window layer with a global one.
const GPT_OSS_SLIDING_PATTERN: usize = 2;

/// RoPE base of gemma 3's sliding-window layers (not stored in its GGUF files).
const GEMMA3_SLIDING_ROPE_THETA: f32 = 10_000.0;

/// llama.cpp's `expert_gating_func` values that mean a softmax router (0: unset, which
/// llama.cpp reads as softmax; 1: softmax).
const GATING_SOFTMAX: [usize; 2] = [0, 1];
/// llama.cpp's `expert_gating_func` of a softmax over the chosen experts' logits.
const GATING_SOFTMAX_WEIGHT: usize = 3;
/// llama.cpp's `expert_gating_func` of a sigmoid router (GLM-4.5; llama.cpp's default
/// for glm4moe files).
const GATING_SIGMOID: usize = 2;

/// The mixture of a `qwen3moe` file, or of a `llama` file with experts (Mixtral as
/// llama.cpp converts it): `<arch>.expert_count` experts, `<arch>.expert_used_count` per
/// token, each of `<arch>.expert_feed_forward_length` columns (llama: of
/// `feed_forward_length` when that key is absent), in the layers that have a router
/// (`blk.N.ffn_gate_inp.weight`). The chosen experts' weights are renormalised, as
/// llama.cpp does for both architectures, unless `<arch>.expert_weights_norm` says
/// otherwise. `None` for a dense model.
fn moe_config(content: &Content, arch: &str, num_layers: usize) -> Result<Option<MoeConfig>> {
    let md = &content.metadata;
    let key = |k: &str| format!("{arch}.{k}");
    let fail = |m: String| Err(EngineError::Config(m));
    let count = meta_usize_opt(md, &key("expert_count"))?;
    let names = match (arch, count) {
        ("qwen3moe", _) => ExpertNames::Qwen3Moe,
        ("gpt-oss", _) => ExpertNames::GptOss,
        ("glm4moe", _) => ExpertNames::Qwen3Moe,
        ("minimax-m2", _) => ExpertNames::MiniMaxM2,
        (_, None | Some(0)) => return Ok(None),
        ("llama", Some(_)) => ExpertNames::Mixtral,
        (_, Some(n)) => {
            return fail(format!(
                "{} {n}: mixtures of experts are read from qwen3moe, gpt-oss, glm4moe, \
                 minimax-m2 and llama files only",
                key("expert_count")
            ))
        }
    };
    let gpt_oss = names == ExpertNames::GptOss;
    let glm = arch == "glm4moe";
    // MiniMax-M2's router is a sigmoid too; files of its first converter state none.
    let sigmoid_family = glm || arch == "minimax-m2";
    let Some(num_experts) = count else {
        return fail(format!("{} is missing", key("expert_count")));
    };
    let top_k = meta_usize(md, &key("expert_used_count"))?;
    let (intermediate_field, intermediate_size) =
        match meta_usize_opt(md, &key("expert_feed_forward_length"))? {
            Some(n) => (key("expert_feed_forward_length"), n),
            None if names == ExpertNames::Mixtral => (
                key("feed_forward_length"),
                meta_usize(md, &key("feed_forward_length"))?,
            ),
            None => return fail(format!("{} is missing", key("expert_feed_forward_length"))),
        };
    let shared = meta_usize_opt(md, &key("expert_shared_count"))?.filter(|n| *n > 0);
    if let Some(shared) = shared.filter(|_| !glm) {
        return fail(format!(
            "{} {shared}: shared experts are read from glm4moe files only",
            key("expert_shared_count")
        ));
    }
    // gpt-oss softmaxes the chosen experts' logits (llama.cpp's "softmax weight", 3): the
    // renormalised softmax of the others. GLM-4.5's router is a sigmoid, which llama.cpp
    // assumes where a glm4moe file says nothing.
    let gating = meta_usize_opt(md, &key("expert_gating_func"))?;
    let sigmoid = sigmoid_family && matches!(gating, None | Some(0) | Some(GATING_SIGMOID));
    if let Some(gating) = gating.filter(|g| {
        !(sigmoid
            || (!sigmoid_family && GATING_SOFTMAX.contains(g))
            || (gpt_oss && *g == GATING_SOFTMAX_WEIGHT))
    }) {
        return fail(format!(
            "{} {gating}: {arch} files are read with the {} router only",
            key("expert_gating_func"),
            if sigmoid_family {
                "sigmoid (2)"
            } else {
                "softmax (1)"
            }
        ));
    }
    let scale = md
        .contains_key(&key("expert_weights_scale"))
        .then(|| meta_f32(md, &key("expert_weights_scale")))
        .transpose()?;
    if let Some(scale) = scale.filter(|s| *s != 1.0 && !sigmoid) {
        return fail(format!(
            "{} {scale}: scaled expert weights are read from glm4moe files only",
            key("expert_weights_scale")
        ));
    }
    let norm = match md.get(&key("expert_weights_norm")) {
        Some(v) => v.to_bool().map_err(|e| {
            EngineError::Config(format!("metadata '{}': {e}", key("expert_weights_norm")))
        })?,
        None => true,
    };
    let layers: Vec<bool> = (0..num_layers)
        .map(|l| {
            content
                .tensor_infos
                .contains_key(&format!("blk.{l}.ffn_gate_inp.weight"))
        })
        .collect();
    if !layers.contains(&true) {
        return fail(format!(
            "{} {num_experts}, but no layer has a router (blk.N.ffn_gate_inp.weight)",
            key("expert_count")
        ));
    }
    Ok(Some(MoeConfig {
        num_experts,
        top_k,
        intermediate_size,
        norm_topk_prob: norm,
        layers,
        names,
        // gpt-oss: llama.cpp fixes the gate's clamp, as its files state none.
        biases: gpt_oss,
        clamped_swiglu: gpt_oss.then_some(GPT_OSS_SWIGLU),
        sigmoid_router: match sigmoid {
            true => Some(SigmoidRouter {
                groups: meta_usize_opt(md, &key("expert_group_count"))?.unwrap_or(1),
                top_groups: meta_usize_opt(md, &key("expert_group_used_count"))?.unwrap_or(1),
                scale: scale.unwrap_or(1.0),
            }),
            false => None,
        },
        shared_intermediate_size: shared.map(|n| n * intermediate_size),
        fields: MoeFields {
            num_experts: key("expert_count"),
            top_k: key("expert_used_count"),
            intermediate_size: intermediate_field,
        },
    }))
}

/// The model a GGUF file describes, checked ([`ModelConfig::validate`]);
/// `rope_factors` are the values of its RoPE factor tensors, where it has them.
pub(crate) fn config_from_content(
    content: &Content,
    rope_factors: RopeFactorTensors,
) -> Result<ModelConfig> {
    let md = &content.metadata;
    let arch = meta(md, "general.architecture")?
        .to_string()
        .map_err(|e| EngineError::Config(e.to_string()))?
        .clone();
    let rope_style = gguf_rope_style(&arch)?;
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = meta_usize(md, &key("embedding_length"))?;
    let num_heads = meta_usize(md, &key("attention.head_count"))?;
    let num_kv_heads = meta_usize(md, &key("attention.head_count_kv")).unwrap_or(num_heads);
    // phi3 files state no key length: the head is hidden / heads, and
    // rope.dimension_count its rotated part (Phi-4-mini: 96 of 128).
    let rotary = meta_usize_opt(md, &key("rope.dimension_count"))?;
    let head_dim = if arch == "phi3" {
        hidden / num_heads.max(1)
    } else {
        meta_usize(md, &key("attention.key_length"))
            .ok()
            .or(rotary)
            .unwrap_or(hidden / num_heads.max(1))
    };
    let vocab_size = match meta_usize(md, &key("vocab_size")) {
        Ok(v) => v,
        Err(_) => match md.get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => tokens.len(),
            _ => return Err(EngineError::Config("vocabulary size unknown".into())),
        },
    };
    // GLM-4.5's files count their multi-token-prediction layers among the blocks (after
    // the others); Tessera reads the others only.
    let blocks = meta_usize(md, &key("block_count"))?;
    let prediction_layers = meta_usize_opt(md, &key("nextn_predict_layers"))?.unwrap_or(0);
    let Some(num_layers) = blocks.checked_sub(prediction_layers) else {
        return Err(EngineError::Config(format!(
            "{} {prediction_layers} exceeds {} {blocks}",
            key("nextn_predict_layers"),
            key("block_count")
        )));
    };
    let moe = moe_config(content, &arch, num_layers)?;
    // A model whose every layer is a mixture need not state a dense MLP width.
    let intermediate_size = match (meta_usize(md, &key("feed_forward_length")), &moe) {
        (Ok(n), _) => n,
        (Err(_), Some(m)) if !m.layers.contains(&false) => m.intermediate_size,
        (Err(e), _) => return Err(e),
    };
    let config = ModelConfig {
        architecture: arch.clone(),
        vocab_size,
        hidden_size: hidden,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rotary_dim: rotary.unwrap_or(head_dim),
        rms_norm_eps: f64::from(
            meta_f32(md, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        ),
        rope_theta: meta_f32(md, &key("rope.freq_base")).unwrap_or(10_000.0),
        rope_scaling: RopeScaling::from_gguf(md, &arch, rope_factors)?,
        rope_style,
        max_position_embeddings: meta_usize(md, &key("context_length")).unwrap_or(4096),
        // GLM-4 and GLM-4.5 files hold the biases their checkpoints have
        // (attention_bias), and GLM-4.5's the query/key norms (use_qk_norm).
        attention_bias: arch == "qwen2"
            || (matches!(arch.as_str(), "glm4" | "glm4moe")
                && content.tensor_infos.contains_key("blk.0.attn_q.bias")),
        qk_norm: matches!(arch.as_str(), "qwen3" | "qwen3moe" | "olmo2" | "minimax-m2")
            || (arch == "glm4moe"
                && content
                    .tensor_infos
                    .contains_key("blk.0.attn_q_norm.weight")),
        // MiniMax-M2's norms span all heads, as OLMo 2's.
        qk_norm_across_heads: matches!(arch.as_str(), "olmo2" | "minimax-m2"),
        input_norms: arch != "olmo2",
        sandwich_norms: matches!(arch.as_str(), "glm4" | "olmo2"),
        nope_layers: if arch == "smollm3" {
            every_nth_layer(num_layers, SMOLLM3_NOPE_INTERVAL)
        } else {
            Vec::new()
        },
        moe,
        ..ModelConfig::default()
    };
    let config = match arch.as_str() {
        "gemma2" | "gemma3" => gemma_config(md, &arch, config)?,
        "granite" => granite_config(md, config)?,
        "gpt-oss" => gpt_oss_config(content, md, config)?,
        "olmo2" => olmo3_window(md, config)?,
        _ => config,
    };
    config.validate()?;
    Ok(config)
}

/// The GGUF architectures Tessera reads, with the rope style of their files.
pub(crate) fn gguf_rope_style(arch: &str) -> Result<RopeStyle> {
    match arch {
        // glm4: GLM's rotation pairs neighbours, and its files keep the rows as trained.
        "llama" | "mistral" | "smollm3" | "granite" | "glm4" => Ok(RopeStyle::Interleaved),
        "qwen2" | "qwen3" | "qwen3moe" | "gemma2" | "gemma3" | "phi3" | "olmo2" | "gpt-oss"
        | "glm4moe" | "minimax-m2" => Ok(RopeStyle::Half),
        other => Err(EngineError::UnknownArchitecture(other.to_string())),
    }
}

#[cfg(test)]
mod tests;
