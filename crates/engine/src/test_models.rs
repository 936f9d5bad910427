//! Random-weight models for tests of the GPU path (feature `gpu-emulation`), in the head
//! dimensions CUDA ranks serve (64, 128, 256), written as bf16 safetensors from a fixed
//! seed. Each takes the architecture of a tiny fixture (`tests/fixtures/models/tiny-*`:
//! its config and tensor names) with larger dimensions, so every family the engine loads
//! (dense, QKV bias, query/key norms, sliding windows, Gemma 3, mixtures of experts) can
//! run on the GPU path on any machine.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};
use tessera_kernels::gpu::reference::Lcg;

use crate::error::{EngineError, Result};
use crate::families::row::QkNorm;
use crate::families::table::hf_row;

/// The dimensions that replace the fixture's.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
}

/// The context of every written model.
const MAX_POSITIONS: usize = 2048;

/// The dimensions the GPU-path tests give the tiny fixture `name`.
pub fn gpu_shaped(name: &str) -> Result<Dims> {
    let d = |hidden, heads, kv_heads, head_dim, intermediate| Dims {
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate,
    };
    Ok(match name {
        // GQA 6/2 (4 ranks replicate KV heads and split query heads unevenly).
        "tiny-llama" => d(192, 6, 2, 64, 256),
        // QKV bias, head dim 128.
        "tiny-qwen2" => d(128, 4, 2, 128, 256),
        // Query/key norms, head dim 128 (not hidden / heads).
        "tiny-qwen3" => d(160, 4, 2, 128, 192),
        // Every layer attends to its last 8 positions.
        "tiny-mistral" => d(128, 4, 2, 64, 192),
        // Sliding layers with their own RoPE base, sandwich norms, GELU, one KV head.
        "tiny-gemma3" => d(128, 2, 1, 256, 192),
        // RoPE scaled for long contexts: YaRN (cos and sin times its attention factor),
        // and linear in gemma's global layers only.
        "tiny-qwen3-yarn" => d(160, 4, 2, 128, 192),
        "tiny-gemma3-linear" => d(128, 2, 1, 256, 192),
        // Fused query/key/value and gate/up projections; head = hidden / heads.
        "tiny-phi3" => d(256, 4, 2, 64, 192),
        // A window in every other layer; capped attention scores and logits.
        "tiny-gemma2" => d(128, 4, 2, 128, 192),
        // A layer without RoPE between rotating ones.
        "tiny-smollm3" => d(192, 6, 2, 64, 256),
        // Three quarters of each head of 128 rotate, with LongRoPE (Phi-4-mini).
        "tiny-phi4-mini" => d(512, 4, 2, 128, 192),
        // Granite's embedding, attention, residual and logit scalars.
        "tiny-granite" => d(256, 4, 2, 64, 192),
        // Half of each head of 128 rotating in neighbouring pairs, biases, a fused gate/up
        // projection, norms after attention and the MLP (GLM-4).
        "tiny-glm4" => d(256, 4, 2, 128, 192),
        // No input norms; query/key norms across all heads (OLMo 2).
        "tiny-olmo2" => d(256, 4, 2, 64, 192),
        // OLMo 2's layer with a window in three layers of four, YaRN on the full one.
        "tiny-olmo3" => d(256, 4, 2, 64, 192),
        // Mixtures of experts.
        "tiny-qwen3-moe" | "tiny-mixtral" => d(128, 4, 2, 64, 160),
        // Attention sinks, biases on every projection, a window in every other layer;
        // biased experts (stacked, transposed) with a clamped gate (gpt-oss).
        "tiny-gpt-oss" => d(128, 4, 2, 64, 96),
        // A dense layer, then mixtures with a sigmoid router choosing in groups and a
        // shared expert; half of each head rotating in halves; query/key norms (GLM-4.5).
        "tiny-glm4-moe" => d(192, 4, 2, 128, 160),
        // The same with its multi-token-prediction layer.
        "tiny-glm4-moe-mtp" => d(192, 4, 2, 128, 160),
        // Every layer a mixture with a sigmoid router and correction biases; query/key
        // norms across all heads; half of each head of 128 rotating (MiniMax-M2).
        "tiny-minimax-m2" => d(192, 4, 2, 128, 160),
        other => return Err(bad(format!("no GPU-shaped dimensions for {other}"))),
    })
}

/// LongRoPE's factor lists stretched over the rotation pairs of a head of `head_dim`
/// (each new pair takes the factor at the same relative place in the fixture's list).
fn resize_longrope_factors(c: &mut serde_json::Map<String, Value>, head_dim: usize) {
    let partial = c
        .get("partial_rotary_factor")
        .and_then(Value::as_f64)
        .unwrap_or(1.0);
    let pairs = (head_dim as f64 * partial) as usize / 2;
    let Some(scaling) = c.get_mut("rope_scaling").and_then(Value::as_object_mut) else {
        return;
    };
    for key in ["short_factor", "long_factor"] {
        if let Some(old) = scaling.get(key).and_then(Value::as_array).cloned() {
            let new: Vec<Value> = (0..pairs)
                .map(|i| old[i * old.len() / pairs.max(1)].clone())
                .collect();
            scaling.insert(key.into(), Value::Array(new));
        }
    }
}

fn bad(what: String) -> EngineError {
    EngineError::Config(format!("random model: {what}"))
}

/// Writes the model of the fixture folder `fixture` with `dims` into `out` (created).
pub fn write(fixture: &Path, out: &Path, dims: &Dims, seed: u64) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let text = std::fs::read_to_string(fixture.join("config.json"))?;
    let mut config: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let c = config
        .as_object_mut()
        .ok_or_else(|| bad("config.json is not an object".into()))?;
    // MiniMax-M2 names how many dimensions rotate: the same share of the new head.
    if let (Some(rotary), Some(head)) = (
        c.get("rotary_dim").and_then(Value::as_u64),
        c.get("head_dim").and_then(Value::as_u64),
    ) {
        let scaled = rotary as usize * dims.head_dim / (head as usize).max(1);
        c.insert("rotary_dim".into(), json!(scaled));
    }
    c.insert("hidden_size".into(), json!(dims.hidden));
    c.insert("num_attention_heads".into(), json!(dims.heads));
    c.insert("num_key_value_heads".into(), json!(dims.kv_heads));
    c.insert("head_dim".into(), json!(dims.head_dim));
    c.insert("intermediate_size".into(), json!(dims.intermediate));
    // The stretch of a scaled context is kept (Phi-3's LongRoPE: 4 over 32 becomes 4
    // over 512), and with it the attention factor.
    let old_context = c
        .get("max_position_embeddings")
        .and_then(Value::as_u64)
        .unwrap_or(MAX_POSITIONS as u64);
    if let Some(original) = c
        .get("original_max_position_embeddings")
        .and_then(Value::as_u64)
    {
        let stretched = MAX_POSITIONS as u64 * original / old_context.max(1);
        c.insert("original_max_position_embeddings".into(), json!(stretched));
    }
    c.insert("max_position_embeddings".into(), json!(MAX_POSITIONS));
    if c.contains_key("moe_intermediate_size") {
        c.insert("moe_intermediate_size".into(), json!(dims.intermediate / 2));
    }
    if c.contains_key("query_pre_attn_scalar") {
        c.insert("query_pre_attn_scalar".into(), json!(dims.head_dim));
    }
    resize_longrope_factors(c, dims.head_dim);
    let moe_width = c
        .get("moe_intermediate_size")
        .and_then(Value::as_u64)
        .map(|w| w as usize);
    let experts = ["num_local_experts", "num_experts", "n_routed_experts"]
        .iter()
        .find_map(|k| c.get(*k).and_then(Value::as_u64))
        .unwrap_or(0) as usize;
    let vocab = c
        .get("vocab_size")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("no vocab_size".into()))? as usize;
    let model_type = c
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let across_heads = hf_row(model_type)?.layer.qk_norm == QkNorm::AcrossHeads;
    let shared = c
        .get("n_shared_experts")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    let text = serde_json::to_string_pretty(&config).map_err(|e| bad(e.to_string()))?;
    let tmp = temporary(out, "config.json");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, out.join("config.json"))?;

    // `Lcg::unit` is uniform in [-1, 1).
    let mut rng = Lcg(seed);
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for name in tensor_names(fixture)? {
        let shape = match name.rsplit('.').nth(1) {
            // OLMo 2's query and key norms span all heads.
            Some("q_norm") if across_heads => vec![dims.heads * dims.head_dim],
            Some("k_norm") if across_heads => vec![dims.kv_heads * dims.head_dim],
            // GLM-4.5's shared expert: `n_shared_experts` experts' width.
            _ if name.contains(".shared_experts.") => {
                let width = moe_width.unwrap_or(dims.intermediate) * shared;
                match name.contains("down_proj") {
                    true => vec![dims.hidden, width],
                    false => vec![width, dims.hidden],
                }
            }
            _ => shape_of(&name, dims, vocab, experts, moe_width)?,
        };
        // gpt-oss's stacked experts are `[experts, in, out]`.
        let fan_in = match shape.as_slice() {
            [_, fan_in, _] => *fan_in,
            _ => shape.last().copied().unwrap_or(1),
        };
        let count: usize = shape.iter().product();
        let values: Vec<f32> = if name.ends_with("norm.weight") {
            (0..count).map(|_| 1.0 + 0.1 * rng.unit()).collect()
        } else if name.contains("embed_tokens") {
            rng.values(count)
        } else if name.ends_with("e_score_correction_bias") {
            // Of the sigmoid scores' size, so that they change which experts are chosen.
            (0..count).map(|_| 0.3 * rng.unit()).collect()
        } else if name.ends_with(".bias") || name.ends_with("_bias") {
            (0..count).map(|_| 0.1 * rng.unit()).collect()
        } else if name.ends_with("self_attn.sinks") {
            // Sink logits of the scores' size, so that they take a share of each softmax.
            (0..count).map(|_| 2.0 * rng.unit()).collect()
        } else if ["mlp.gate.weight", "moe.gate.weight", "mlp.router.weight"]
            .iter()
            .any(|r| name.ends_with(r))
        {
            // Routers with large weights (standard deviation 0.5).
            (0..count).map(|_| 0.5 * 3f32.sqrt() * rng.unit()).collect()
        } else {
            // Uniform with standard deviation 1.2 / sqrt(fan_in): logits spread enough
            // that greedy choices are rarely near ties.
            let a = 1.2 * 3f32.sqrt() / (fan_in as f32).sqrt();
            (0..count).map(|_| a * rng.unit()).collect()
        };
        let bytes = values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        tensors.insert(name, (shape, bytes));
    }
    let views = tensors
        .iter()
        .map(|(n, (shape, bytes))| {
            TensorView::new(Dtype::BF16, shape.clone(), bytes)
                .map(|v| (n.clone(), v))
                .map_err(|e| bad(format!("{n}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let tmp = temporary(out, "model.safetensors");
    safetensors::tensor::serialize_to_file(views, None, &tmp).map_err(|e| bad(e.to_string()))?;
    std::fs::rename(&tmp, out.join("model.safetensors"))?;
    Ok(())
}

/// A file name in `dir` of this process and thread: tests that write the same model at
/// once each write their own, then rename it over the final name (the contents are the
/// same), so no reader sees half a file.
fn temporary(dir: &Path, name: &str) -> std::path::PathBuf {
    let thread = format!("{:?}", std::thread::current().id())
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>();
    dir.join(format!(".{name}.{}.{thread}", std::process::id()))
}

/// The tensor names of the fixture's safetensors files, sorted.
fn tensor_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path)?;
            let file = safetensors::SafeTensors::deserialize(&bytes)
                .map_err(|e| bad(format!("{}: {e}", path.display())))?;
            names.extend(file.names().into_iter().map(str::to_string));
        }
    }
    names.sort();
    Ok(names)
}

/// The shape of tensor `name` in a model of `d`.
fn shape_of(
    name: &str,
    d: &Dims,
    vocab: usize,
    experts: usize,
    moe_width: Option<usize>,
) -> Result<Vec<usize>> {
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let ffn = if name.contains(".experts.") {
        moe_width.unwrap_or(d.intermediate)
    } else {
        d.intermediate
    };
    let any = |suffixes: &[&str]| suffixes.iter().any(|s| name.ends_with(s));
    Ok(if any(&["mlp.experts.gate_up_proj"]) {
        vec![experts, d.hidden, 2 * ffn]
    } else if any(&["mlp.experts.gate_up_proj_bias"]) {
        vec![experts, 2 * ffn]
    } else if any(&["mlp.experts.down_proj"]) {
        vec![experts, ffn, d.hidden]
    } else if any(&["mlp.experts.down_proj_bias"]) {
        vec![experts, d.hidden]
    } else if any(&[
        "mlp.router.bias",
        "mlp.gate.e_score_correction_bias",
        "block_sparse_moe.e_score_correction_bias",
    ]) {
        vec![experts]
    } else if any(&["self_attn.sinks"]) {
        vec![d.heads]
    } else if any(&["o_proj.bias"]) {
        vec![d.hidden]
    } else if any(&[
        "embed_tokens.weight",
        "lm_head.weight",
        "shared_head.head.weight",
    ]) {
        vec![vocab, d.hidden]
    } else if any(&["eh_proj.weight"]) {
        // GLM-4.5's MTP projection of the embedding and hidden state, side by side.
        vec![d.hidden, 2 * d.hidden]
    } else if any(&["qkv_proj.weight"]) {
        vec![q + 2 * kv, d.hidden]
    } else if any(&["gate_up_proj.weight"]) {
        vec![2 * ffn, d.hidden]
    } else if any(&["q_norm.weight", "k_norm.weight"]) {
        vec![d.head_dim]
    } else if any(&["norm.weight"]) {
        vec![d.hidden]
    } else if any(&["q_proj.weight"]) {
        vec![q, d.hidden]
    } else if any(&["k_proj.weight", "v_proj.weight"]) {
        vec![kv, d.hidden]
    } else if any(&["q_proj.bias"]) {
        vec![q]
    } else if any(&["k_proj.bias", "v_proj.bias"]) {
        vec![kv]
    } else if any(&["o_proj.weight"]) {
        vec![d.hidden, q]
    } else if any(&[
        "gate_proj.weight",
        "up_proj.weight",
        "w1.weight",
        "w3.weight",
    ]) {
        vec![ffn, d.hidden]
    } else if any(&["down_proj.weight", "w2.weight"]) {
        vec![d.hidden, ffn]
    } else if any(&[
        "mlp.gate.weight",
        "block_sparse_moe.gate.weight",
        "mlp.router.weight",
    ]) {
        vec![experts, d.hidden]
    } else {
        return Err(bad(format!("no shape rule for {name}")));
    })
}
