//! Broken model folders fail with errors that name the problem.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

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
