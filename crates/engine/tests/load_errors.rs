//! Broken model folders and files fail with errors that name the problem.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::*;
use tessera_engine::{Engine, EngineConfig};

/// A copy of tiny-llama in a scratch folder, with its tensors edited by `edit`.
fn edited_copy(name: &str, edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> PathBuf {
    let src = fixtures().join("tiny-llama");
    let dir = std::env::temp_dir().join(format!("tessera-load-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).expect("config");
    let mut tensors = HashMap::new();
    for shard in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ] {
        tensors
            .extend(candle_core::safetensors::load(src.join(shard), &Device::Cpu).expect("shard"));
    }
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).expect("save");
    dir
}

fn load_error(dir: PathBuf) -> String {
    match Engine::load(&EngineConfig::new(dir)) {
        Ok(_) => panic!("the broken model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = edited_copy("missing", |t| {
        t.remove("model.layers.1.mlp.down_proj.weight");
    });
    let err = load_error(dir);
    assert!(
        err.contains("missing tensor 'model.layers.1.mlp.down_proj.weight'"),
        "{err}"
    );
}

#[test]
fn a_wrong_shape_says_expected_and_found() {
    let dir = edited_copy("shape", |t| {
        let bad = Tensor::zeros((320, 100), candle_core::DType::F32, &Device::Cpu).expect("zeros");
        t.insert("model.layers.0.mlp.gate_proj.weight".into(), bad);
    });
    let err = load_error(dir);
    assert!(
        err.contains(
            "'model.layers.0.mlp.gate_proj.weight' has shape [320, 100], expected [320, 144]"
        ),
        "{err}"
    );
}

#[test]
fn a_tensor_parallel_size_the_heads_cannot_take_is_refused_with_the_limit() {
    let mut cfg = EngineConfig::new(fixtures().join("tiny-llama")).with_cpu_ranks(10);
    cfg.kv_cache_bytes = 1 << 20;
    let err = Engine::load(&cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("at most 9 ranks"), "{err}");
}

/// Metadata and tensors of a GGUF file, editable.
struct GgufParts {
    metadata: HashMap<String, gguf_file::Value>,
    tensors: HashMap<String, QTensor>,
}

/// A copy of tiny-qwen3-moe.gguf in a scratch file, edited by `edit`.
fn edited_moe_gguf(name: &str, edit: impl FnOnce(&mut GgufParts)) -> PathBuf {
    edited_gguf("tiny-qwen3-moe.gguf", name, edit)
}

/// A copy of the fixture GGUF file `fixture` in a scratch file, edited by `edit`.
fn edited_gguf(fixture: &str, name: &str, edit: impl FnOnce(&mut GgufParts)) -> PathBuf {
    let src = fixtures().join(fixture);
    let mut file = std::fs::File::open(&src).expect("open gguf");
    let content = gguf_file::Content::read(&mut file).expect("read gguf");
    let mut parts = GgufParts {
        metadata: content.metadata.clone(),
        tensors: HashMap::new(),
    };
    for tensor in content.tensor_infos.keys() {
        let q = content
            .tensor(&mut file, tensor, &Device::Cpu)
            .expect("tensor");
        parts.tensors.insert(tensor.clone(), q);
    }
    edit(&mut parts);
    let path =
        std::env::temp_dir().join(format!("tessera-load-{}-{name}.gguf", std::process::id()));
    let metadata: Vec<(&str, &gguf_file::Value)> = parts
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensors: Vec<(&str, &QTensor)> =
        parts.tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(&path).expect("create gguf");
    gguf_file::write(&mut out, &metadata, &tensors).expect("write gguf");
    path
}

fn load_error_tp(path: PathBuf, tp: usize) -> String {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(tp);
    cfg.kv_cache_bytes = 1 << 20;
    match Engine::load(&cfg) {
        Ok(_) => panic!("the broken model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_mixture_metadata_in_gguf_is_refused_by_key() {
    use gguf_file::Value;
    for (key, value, says) in [
        (
            "qwen3moe.expert_used_count",
            Value::U32(7),
            "qwen3moe.expert_used_count 7 must be between 1 and qwen3moe.expert_count (6)",
        ),
        (
            "qwen3moe.expert_count",
            Value::U32(0),
            "qwen3moe.expert_count 0 must be between 1",
        ),
        (
            "qwen3moe.expert_gating_func",
            Value::U32(2),
            "qwen3moe.expert_gating_func 2: qwen3moe files are read with the softmax (1) \
             router only",
        ),
        (
            "qwen3moe.expert_shared_count",
            Value::U32(1),
            "qwen3moe.expert_shared_count 1: shared experts are read from glm4moe files only",
        ),
        (
            "qwen3moe.expert_weights_scale",
            Value::F32(2.5),
            "qwen3moe.expert_weights_scale 2.5",
        ),
    ] {
        let path = edited_moe_gguf(key, |g| {
            g.metadata.insert(key.into(), value.clone());
        });
        let err = load_error_tp(path, 1);
        assert!(err.contains(says), "{key}: {err}");
    }
    let path = edited_moe_gguf("no-width", |g| {
        g.metadata.remove("qwen3moe.expert_feed_forward_length");
    });
    let err = load_error_tp(path, 1);
    assert!(
        err.contains("qwen3moe.expert_feed_forward_length is missing"),
        "{err}"
    );
}

/// MiniMax-M2's router is a sigmoid: a minimax-m2 file stating another is refused (one
/// stating none, as its converter's first version wrote them, is read as a sigmoid).
#[test]
fn a_minimax_m2_file_with_a_softmax_router_is_refused() {
    use gguf_file::Value;
    let key = "minimax-m2.expert_gating_func";
    let path = edited_gguf("tiny-minimax-m2.gguf", "minimax-softmax", |g| {
        g.metadata.insert(key.into(), Value::U32(1));
    });
    let err = load_error_tp(path, 1);
    assert!(
        err.contains(
            "minimax-m2.expert_gating_func 1: minimax-m2 files are read with the \
             sigmoid (2) router only"
        ),
        "{err}"
    );
    let path = edited_gguf("tiny-minimax-m2.gguf", "minimax-unstated", |g| {
        g.metadata.remove(key);
    });
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(1);
    cfg.kv_cache_bytes = 1 << 20;
    let engine = Engine::load(&cfg).expect("a file stating no gating loads");
    let router = engine
        .model_config()
        .moe
        .as_ref()
        .and_then(|m| m.sigmoid_router);
    assert!(router.is_some(), "{router:?}");
}

#[test]
fn a_missing_expert_tensor_is_named() {
    let path = edited_moe_gguf("no-down", |g| {
        g.tensors.remove("blk.2.ffn_down_exps.weight");
    });
    let err = load_error_tp(path, 1);
    assert!(
        err.contains(
            "missing tensor 'blk.2.ffn_down_exps.weight (model.layers.2.mlp.experts.0.down_proj.weight)'"
        ),
        "{err}"
    );
}

/// Q8_0 experts of 32 columns are one quantization block: the expert split cannot give two
/// ranks a block each, and the refusal names the key that sets the width.
#[test]
fn experts_too_narrow_for_the_ranks_blocks_are_refused_naming_their_width() {
    let path = edited_moe_gguf("q8-experts", |g| {
        g.metadata.insert(
            "qwen3moe.expert_feed_forward_length".into(),
            gguf_file::Value::U32(32),
        );
        for layer in [0, 2] {
            for (kind, dims) in [
                ("gate", (6, 32, 64)),
                ("up", (6, 32, 64)),
                ("down", (6, 64, 32)),
            ] {
                let zeros =
                    Tensor::zeros(dims, candle_core::DType::F32, &Device::Cpu).expect("zeros");
                let q = QTensor::quantize(&zeros, GgmlDType::Q8_0).expect("quantize");
                g.tensors
                    .insert(format!("blk.{layer}.ffn_{kind}_exps.weight"), q);
            }
        }
    });
    let err = load_error_tp(path.clone(), 2);
    assert!(
        err.contains("expert intermediate columns (qwen3moe.expert_feed_forward_length)")
            && err.contains("use at most 1 ranks"),
        "{err}"
    );
    // One rank holds every block.
    let mut cfg = EngineConfig::new(path);
    cfg.kv_cache_bytes = 1 << 20;
    assert!(Engine::load(&cfg).is_ok());
}

#[test]
fn nccl_for_ranks_sharing_a_gpu_is_refused_for_cpu_ranks() {
    let mut cfg = EngineConfig::new(fixtures().join("tiny-llama")).with_cpu_ranks(2);
    cfg.same_gpu_comm = tessera_engine::tp::SameGpuComm::Nccl;
    let err = match Engine::load(&cfg) {
        Ok(_) => panic!("CPU ranks loaded with --same-gpu-comm nccl"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("--same-gpu-comm nccl") && err.contains("CPU ranks"),
        "{err}"
    );
}
