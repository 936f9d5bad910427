//! Embedding sequences against transformers: the pooled final hidden states (last token,
//! mean, first token; unit length) of tiny random-weight Qwen3 and llama models, at TP = 1
//! and 2, each prompt prefilled in two chunks over two steps beside the others and a
//! generating sequence, within cosine 0.9999 of `fixtures/<model>/embeddings.json`.
//! `gpu_emulated/embeddings.rs` and `gpu/models/embeddings.rs` hold the GPU path to these.

mod common;

use common::embedding::{cosine, embed};
use common::*;
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::PoolingKind;

fn check(model: &str, tp: usize) {
    check_file(model, &fixtures().join(model), tp);
}

/// The embeddings of the model at `path` against the references of fixture `model`.
fn check_file(model: &str, path: &std::path::Path, tp: usize) {
    let reference = read_json(fixtures().join(model).join("embeddings.json"));
    let prompts: Vec<Vec<u32>> = reference["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(ids)
        .collect();
    let cfg = EngineConfig::new(path).with_cpu_ranks(tp);
    let mut engine = Engine::load(&cfg).expect("load");
    for (kind, name) in [
        (PoolingKind::Last, "last"),
        (PoolingKind::Mean, "mean"),
        (PoolingKind::Cls, "cls"),
    ] {
        let want: Vec<Vec<f32>> = reference["pooled"][name]
            .as_array()
            .expect("pooled")
            .iter()
            .map(floats)
            .collect();
        let got = embed(&mut engine, &prompts, kind);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let norm: f64 = g.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            assert!(
                (norm - 1.0).abs() < 1e-5,
                "{model} tp={tp} {name} #{i}: norm {norm}"
            );
            let cos = cosine(g, w);
            println!(
                "{model} tp={tp} {name} prompt of {}: cosine {cos:.7}",
                prompts[i].len()
            );
            assert!(cos >= 0.9999, "{model} tp={tp} {name} #{i}: cosine {cos}");
        }
        // The poolings differ (the check could not pass by one vector for all).
        if kind != PoolingKind::Last {
            let last = floats(&reference["pooled"]["last"][3]);
            assert!(
                cosine(&got[3], &last) < 0.99,
                "{model} {name} equals last pooling"
            );
        }
    }
}

#[test]
fn tiny_qwen3_embeddings_match_transformers_at_tp_1_and_2() {
    check("tiny-qwen3", 1);
    check("tiny-qwen3", 2);
}

/// The same weights in a GGUF file (f32): pooled from the GGUF reader's model.
#[test]
fn tiny_qwen3_gguf_embeddings_match_transformers() {
    check_file("tiny-qwen3", &fixtures().join("tiny-qwen3.gguf"), 1);
}

#[test]
fn tiny_llama_embeddings_match_transformers_at_tp_1_and_2() {
    check("tiny-llama", 1);
    check("tiny-llama", 2);
}
