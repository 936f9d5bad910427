//! Embeddings on CUDA ranks (`tessera serve --runner pooling` on a GPU): each pooling's
//! unit vectors of the check prompts on `cuda:0` and at TP = 2 on one GPU, against the
//! CPU engine's (which `tests/embeddings.rs` holds to transformers). The CUDA ranks
//! compute in bf16 where the CPU engine computes in f32; a relative error of a few 1e-3 in
//! the hidden states leaves the cosine of unit vectors within 1e-5 of 1, so the bound is
//! the CPU tests' 0.9999.

use tessera_protocol::PoolingKind;

use super::{engine, models_dir, selected};
use crate::common::embedding::{cosine, embed};
use crate::common::gpu_check_prompts;
use crate::report::check;

const BOUND: f64 = 0.9999;

#[test]
fn cuda_embeddings_match_the_cpu_engine() {
    for name in ["llama", "qwen3"].into_iter().filter(|m| selected(m)) {
        let dir = models_dir().join(name);
        let mut cpu = engine(&dir, "cpu:0");
        // The prompts of the logits checks but the 700-token one: every pooling kind of
        // each, in two chunks over two steps beside a generating sequence.
        let mut prompts = gpu_check_prompts(&dir, cpu.model_config().vocab_size);
        prompts.pop();
        for spec in ["cuda:0", "cuda:0,cuda:0"] {
            let mut gpu = engine(&dir, spec);
            let mut worst = 1f64;
            for kind in [PoolingKind::Last, PoolingKind::Mean, PoolingKind::Cls] {
                let want = embed(&mut cpu, &prompts, kind);
                let got = embed(&mut gpu, &prompts, kind);
                for (g, w) in got.iter().zip(&want) {
                    worst = worst.min(cosine(g, w));
                }
            }
            check(
                &format!("{name} bf16: embeddings on {spec} (last, mean, first token) against the CPU engine"),
                format!("worst cosine {worst:.7} over {} prompts x 3 poolings", prompts.len()),
                format!(">= {BOUND}"),
                worst >= BOUND,
            );
        }
    }
}
