//! Random-weight models in the head dimensions CUDA ranks serve (64, 128, 256), written
//! as bf16 safetensors from a fixed seed. Each takes the architecture of one of the tiny
//! fixtures (`tests/fixtures/models/tiny-*`: its config and tensor names) with larger
//! dimensions, so every family the engine loads (dense, QKV bias, query/key norms,
//! sliding windows, Gemma 3, mixtures of experts) runs on the GPU path here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};
use tessera_kernels::gpu::reference::Lcg;

use crate::common::{fixtures, read_json};

/// The dimensions that replace the fixture's.
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
}

/// Writes the model `fixture` with `dims` to a fresh folder under the target directory
/// and returns it.
pub fn write(fixture: &str, dims: &Dims, seed: u64) -> PathBuf {
    let src = fixtures().join(fixture);
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpu-emulated-{fixture}-hd{}-{seed}", dims.head_dim));
    std::fs::create_dir_all(&out).expect("model folder");
    let mut config = read_json(src.join("config.json"));
    let c = config.as_object_mut().expect("config object");
    c.insert("hidden_size".into(), json!(dims.hidden));
    c.insert("num_attention_heads".into(), json!(dims.heads));
    c.insert("num_key_value_heads".into(), json!(dims.kv_heads));
    c.insert("head_dim".into(), json!(dims.head_dim));
    c.insert("intermediate_size".into(), json!(dims.intermediate));
    c.insert("max_position_embeddings".into(), json!(2048));
    if c.contains_key("moe_intermediate_size") {
        c.insert("moe_intermediate_size".into(), json!(dims.intermediate / 2));
    }
    if c.contains_key("query_pre_attn_scalar") {
        c.insert("query_pre_attn_scalar".into(), json!(dims.head_dim));
    }
    let moe_width = c
        .get("moe_intermediate_size")
        .and_then(Value::as_u64)
        .map(|w| w as usize);
    let experts = ["num_local_experts", "num_experts"]
        .iter()
        .find_map(|k| c.get(*k).and_then(Value::as_u64))
        .unwrap_or(0) as usize;
    let vocab = c["vocab_size"].as_u64().expect("vocab_size") as usize;
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&config).expect("config"),
    )
    .expect("write config");

    // `Lcg::unit` is uniform in [-1, 1).
    let mut rng = Lcg(seed);
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for name in tensor_names(&src) {
        let shape = shape_of(&name, dims, vocab, experts, moe_width);
        let fan_in = *shape.last().expect("a dimension");
        let count: usize = shape.iter().product();
        let values: Vec<f32> = if name.ends_with("norm.weight") {
            (0..count).map(|_| 1.0 + 0.1 * rng.unit()).collect()
        } else if name.contains("embed_tokens") {
            rng.values(count)
        } else if name.ends_with(".bias") {
            (0..count).map(|_| 0.1 * rng.unit()).collect()
        } else if name.ends_with("mlp.gate.weight") || name.ends_with("moe.gate.weight") {
            // Routers with large weights (standard deviation 0.5): the experts a token
            // picks are rarely near ties, which bf16 activations could tip.
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
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (shape, bytes))| {
            let view = TensorView::new(Dtype::BF16, shape.clone(), bytes).expect("tensor view");
            (n.clone(), view)
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &out.join("model.safetensors"))
        .expect("write safetensors");
    out
}

/// The tensor names of the fixture's safetensors files.
fn tensor_names(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).expect("fixture folder") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).expect("read safetensors");
            let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
            names.extend(file.names().into_iter().map(str::to_string));
        }
    }
    names.sort();
    names
}

/// The shape of tensor `name` in a model of `dims`.
fn shape_of(
    name: &str,
    d: &Dims,
    vocab: usize,
    experts: usize,
    moe_width: Option<usize>,
) -> Vec<usize> {
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let expert = name.contains(".experts.");
    let ffn = if expert {
        moe_width.unwrap_or(d.intermediate)
    } else {
        d.intermediate
    };
    let suffix = |s: &str| name.ends_with(s);
    if suffix("embed_tokens.weight") || suffix("lm_head.weight") {
        vec![vocab, d.hidden]
    } else if suffix("q_norm.weight") || suffix("k_norm.weight") {
        vec![d.head_dim]
    } else if suffix("norm.weight") {
        vec![d.hidden]
    } else if suffix("q_proj.weight") {
        vec![q, d.hidden]
    } else if suffix("k_proj.weight") || suffix("v_proj.weight") {
        vec![kv, d.hidden]
    } else if suffix("q_proj.bias") {
        vec![q]
    } else if suffix("k_proj.bias") || suffix("v_proj.bias") {
        vec![kv]
    } else if suffix("o_proj.weight") {
        vec![d.hidden, q]
    } else if suffix("gate_proj.weight")
        || suffix("up_proj.weight")
        || suffix("w1.weight")
        || suffix("w3.weight")
    {
        vec![ffn, d.hidden]
    } else if suffix("down_proj.weight") || suffix("w2.weight") {
        vec![d.hidden, ffn]
    } else if suffix("mlp.gate.weight") || suffix("block_sparse_moe.gate.weight") {
        vec![experts, d.hidden]
    } else {
        panic!("no shape rule for {name}")
    }
}
