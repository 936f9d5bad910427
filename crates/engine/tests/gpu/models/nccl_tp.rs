//! Tensor parallelism over NCCL with 2 to 4 ranks as threads of one process on the one GPU
//! (`--same-gpu-comm nccl`; NCCL 2.30 with `NCCL_MULTI_RANK_GPU_ENABLE=1`): a dense model,
//! a GQA model whose two KV heads replicate at TP = 4, a mixture of experts and a Q4_1
//! GGUF file, each against TP = 1 and against the same ranks joined by the same-GPU
//! communicator, within the bounds of the same-GPU TP checks; and the bf16 all-reduce.

use std::path::Path;

use tessera_engine::tp::{AllReduceDtype, SameGpuComm};
use tessera_engine::{Engine, EngineConfig};

use super::{devices, each_model, models, Tp1};
use crate::common::{last_logits, rel_l2};
use crate::report::check;

/// The models over NCCL, by their labels in [`models`].
const NCCL_MODELS: [&str; 4] = [
    "llama bf16",
    "qwen2 bf16",
    "qwen3-moe bf16",
    "llama q4_1 GGUF",
];

fn ranks(path: &Path, tp: usize, comm: SameGpuComm, dtype: AllReduceDtype) -> Engine {
    let spec = vec!["cuda:0"; tp].join(",");
    let mut cfg = EngineConfig::new(path);
    cfg.devices = devices(&spec);
    cfg.kv_cache_bytes = 128 << 20;
    cfg.same_gpu_comm = comm;
    cfg.allreduce_dtype = dtype;
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{} on {spec} over {comm}: {e}", path.display()))
}

#[test]
fn tensor_parallel_over_nccl_on_one_gpu_equals_tp1() {
    let checked = models()
        .iter()
        .filter(|m| NCCL_MODELS.contains(&m.0.as_str()));
    each_model(checked, |(label, path, ref_dir)| {
        let tp1 = Tp1::of(path, ref_dir);
        let prompt = &tp1.prompts[1];
        for tp in 2..=4 {
            let same_gpu = last_logits(
                &mut ranks(path, tp, SameGpuComm::Device, AllReduceDtype::F32),
                prompt,
            );
            let mut e = ranks(path, tp, SameGpuComm::Nccl, AllReduceDtype::F32);
            tp1.check(
                label,
                &format!("TP={tp} over NCCL on one GPU"),
                &mut e,
                Some(("the same-GPU communicator", &same_gpu)),
            );
        }
        if label == "llama bf16" {
            // The bf16 all-reduce rounds each partial sum: held to the CUDA bound against
            // TP = 1, and beside the same-GPU communicator doing the same.
            let same_gpu = last_logits(
                &mut ranks(path, 2, SameGpuComm::Device, AllReduceDtype::Bf16),
                prompt,
            );
            let logits = last_logits(
                &mut ranks(path, 2, SameGpuComm::Nccl, AllReduceDtype::Bf16),
                prompt,
            );
            let diff = rel_l2(&logits, &tp1.logits);
            let beside = rel_l2(&logits, &same_gpu);
            check(
                &format!("{label}: TP=2 over NCCL with the bf16 all-reduce against TP=1"),
                format!(
                    "logits rel L2 {diff:.2e} (against the same-GPU communicator {beside:.2e})"
                ),
                "< 2e-2 (both)".into(),
                diff < 2e-2 && beside < 2e-2,
            );
        }
    });
}
