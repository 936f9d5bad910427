//! Embeddings on the GPU path: each pooling's unit vectors on emulated GPU ranks, at
//! TP = 1 and 2, against the CPU ranks' on the same weights (which `tests/embeddings.rs`
//! holds to transformers), at the bound of the GPU check (`gpu/models/embeddings.rs`):
//! bf16 activations move the hidden states by about 1e-2 relative, and the cosine of unit
//! vectors by far less.

use tessera_protocol::PoolingKind;

use super::{engine, model, prompts};
use crate::common::embedding::{cosine, embed};

const BOUND: f64 = 0.9999;

#[test]
fn gpu_path_embeddings_match_the_cpu_engine() {
    for fixture in ["tiny-qwen3", "tiny-llama"] {
        let path = model(fixture);
        let mut cpu = engine(&path, 1, false);
        let prompts = prompts(cpu.model_config().vocab_size);
        let want: Vec<Vec<Vec<f32>>> = [PoolingKind::Last, PoolingKind::Mean, PoolingKind::Cls]
            .into_iter()
            .map(|kind| embed(&mut cpu, &prompts, kind))
            .collect();
        drop(cpu);
        for tp in [1, 2] {
            let mut gpu = engine(&path, tp, true);
            for (kind, want) in [PoolingKind::Last, PoolingKind::Mean, PoolingKind::Cls]
                .into_iter()
                .zip(&want)
            {
                let got = embed(&mut gpu, &prompts, kind);
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let cos = cosine(g, w);
                    println!("{fixture} TP={tp} {kind:?} prompt {i}: cosine {cos:.7}");
                    assert!(
                        cos >= BOUND,
                        "{fixture} TP={tp} {kind:?} prompt {i}: cosine {cos}"
                    );
                }
            }
        }
    }
}
