//! The GPU model checks (`tests/gpu/models.rs`) on emulated GPU ranks, before a GPU is
//! at hand: the same random-weight models (`scripts/gpu/make_models.py`, in the folder
//! `TESSERA_GPU_MODELS`), the same comparisons and bounds (`common`), with the CUDA
//! ranks' forward pass run on the host and our kernels emulated (see `gpu_emulated`).
//! What a GPU adds (cuBLAS, candle's CUDA operations) moves bf16 roundings a little;
//! a check passing here with no room to spare may fail there.
//!
//! The models need torch and transformers, so these tests are ignored by `cargo test`;
//! `scripts/gpu-preflight` makes the models and runs them.

mod common;
#[path = "common/gguf_writer.rs"]
mod gguf_writer;

use std::path::{Path, PathBuf};

use common::*;
use gguf_writer::{check_gguf, BF16_CHECK_MODELS, GGUF_CHECK_FORMATS, GGUF_CHECK_MODELS};
use tessera_engine::{generate, Engine, EngineConfig};

const MIN_COMPARED: usize = 8;

/// Whether to check model `name`: `TESSERA_PREFLIGHT_MODELS` (comma-separated names)
/// narrows the checks, e.g. to the models a change touched.
fn selected(name: &str) -> bool {
    let only = std::env::var("TESSERA_PREFLIGHT_MODELS").unwrap_or_default();
    only.is_empty() || only.split(',').any(|o| o.trim() == name)
}

/// The models of the GPU checks to check.
fn models() -> Vec<&'static str> {
    GGUF_CHECK_MODELS
        .into_iter()
        .chain(BF16_CHECK_MODELS)
        .filter(|m| selected(m))
        .collect()
}

fn model(name: &str) -> PathBuf {
    let dir = std::env::var("TESSERA_GPU_MODELS")
        .expect("TESSERA_GPU_MODELS: the folder scripts/gpu/make_models.py wrote");
    PathBuf::from(dir).join(name)
}

fn engine(path: &Path, ranks: usize, emulate_gpu: bool) -> Engine {
    try_engine(path, ranks, emulate_gpu).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn try_engine(path: &Path, ranks: usize, emulate_gpu: bool) -> Result<Engine, String> {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(ranks);
    cfg.emulate_gpu = emulate_gpu;
    cfg.kv_cache_bytes = 128 << 20;
    Engine::load(&cfg).map_err(|e| e.to_string())
}

#[test]
#[ignore = "needs the GPU checks' models: scripts/gpu-preflight"]
fn gpu_path_logits_match_cpu_and_transformers() {
    for name in models() {
        let dir = model(name);
        let (mut cpu, mut gpu) = (engine(&dir, 1, false), engine(&dir, 1, true));
        let reference = read_json(dir.join("reference.json"));
        let cases = reference["cases"].as_array().expect("cases").clone();
        let (mut worst_cpu, mut worst_hf) = (0f32, 0f32);
        for (i, prompt) in gpu_check_prompts(&dir, cpu.model_config().vocab_size)
            .iter()
            .enumerate()
        {
            let got = last_logits(&mut gpu, prompt);
            worst_cpu = worst_cpu.max(rel_l2(&got, &last_logits(&mut cpu, prompt)));
            if let Some(case) = cases.get(i) {
                worst_hf = worst_hf.max(rel_l2(&got, &floats(&case["last_logits"])));
            }
        }
        let bound = gpu_logits_bound(name);
        println!("{name}: rel L2 {worst_cpu:.2e} to the CPU engine, {worst_hf:.2e} to transformers (< {bound:.0e})");
        assert!(worst_cpu < bound && worst_hf < bound, "{name}");
    }
}

#[test]
#[ignore = "needs the GPU checks' models: scripts/gpu-preflight"]
fn gpu_path_greedy_text_equals_the_cpu_engine() {
    let margin = 0.1;
    for name in models() {
        let dir = model(name);
        let (mut cpu, mut gpu) = (engine(&dir, 1, false), engine(&dir, 1, true));
        let mut compared = 0;
        for prompt in gpu_check_prompts(&dir, cpu.model_config().vocab_size) {
            let want = greedy_steps(&mut cpu, &prompt, 24, 7);
            let got = greedy_steps(&mut gpu, &prompt, 24, 7);
            let served =
                generate(&mut gpu, &prompt, &greedy_opts(24, 7), |_| {}).expect("generate");
            assert_eq!(
                served, got.0,
                "{name}: the device arg-max differs from the copied logits'"
            );
            let (n, same) = agree_until_tie(&want, &got.0, margin);
            assert!(
                same,
                "{name}, prompt of {}: {:?} against {:?}",
                prompt.len(),
                got.0,
                want.0
            );
            compared += n;
        }
        println!("{name}: {compared} greedy tokens compared");
        assert!(compared >= 2 * MIN_COMPARED, "{name}: {compared} compared");
    }
}

#[test]
#[ignore = "needs the GPU checks' models: scripts/gpu-preflight"]
fn gpu_path_tensor_parallel_equals_tp1() {
    for name in models() {
        let dir = model(name);
        let mut tp1 = engine(&dir, 1, true);
        let prompt = gpu_check_prompts(&dir, tp1.model_config().vocab_size).swap_remove(1);
        let base_logits = last_logits(&mut tp1, &prompt);
        let base = greedy_steps(&mut tp1, &prompt, 24, 5);
        drop(tp1);
        for tp in 2..=4 {
            let mut e = engine(&dir, tp, true);
            let diff = rel_l2(&last_logits(&mut e, &prompt), &base_logits);
            let (tokens, _) = greedy_steps(&mut e, &prompt, 24, 5);
            let (n, same) = agree_until_tie(&base, &tokens, GPU_TP_MARGIN);
            println!(
                "{name} TP={tp}: logits rel L2 {diff:.2e}, greedy {n} compared, identical: {same}"
            );
            assert!(diff < 1e-2 && same && n >= MIN_COMPARED, "{name} TP={tp}");
        }
    }
}

#[test]
#[ignore = "needs the GPU checks' models: scripts/gpu-preflight"]
fn gpu_path_gguf_logits_match_cpu_and_tensor_parallel_keeps_the_distance() {
    for name in GGUF_CHECK_MODELS.into_iter().filter(|m| selected(m)) {
        let dir = model(name);
        for (dtype, tag) in GGUF_CHECK_FORMATS {
            let file = check_gguf(&dir, dtype, tag);
            let (mut cpu, mut gpu) = (engine(&file, 1, false), engine(&file, 1, true));
            let prompts = gpu_check_prompts(&dir, cpu.model_config().vocab_size);
            let mut worst = 0f32;
            for prompt in &prompts {
                worst = worst.max(rel_l2(
                    &last_logits(&mut gpu, prompt),
                    &last_logits(&mut cpu, prompt),
                ));
            }
            println!("{name} {tag}: rel L2 {worst:.2e} to the CPU engine (< {GPU_GGUF_LOGITS_BOUND:.0e})");
            assert!(worst < GPU_GGUF_LOGITS_BOUND, "{name} {tag}");
            // As the GPU checks: Q4_1 and Q4_K_M at TP = 2..4 stay as close to the CPU
            // engine as TP = 1 is, give or take half of that distance; Q4_K_M's
            // super-blocks may split a small model over fewer ranks, and more are refused.
            if tag == "q8_0" {
                continue;
            }
            let prompt = &prompts[1];
            let on_cpu = last_logits(&mut cpu, prompt);
            let base = rel_l2(&last_logits(&mut gpu, prompt), &on_cpu);
            drop(gpu);
            for tp in 2..=4 {
                let mut e = match try_engine(&file, tp, true) {
                    Ok(e) => e,
                    Err(why) if tag == "q4_k_m" && why.contains("splits over at most") => {
                        println!("{name} {tag} TP={tp}: refused ({why})");
                        continue;
                    }
                    Err(why) => panic!("{name} {tag} TP={tp}: {why}"),
                };
                let err = rel_l2(&last_logits(&mut e, prompt), &on_cpu);
                println!(
                    "{name} {tag} TP={tp}: rel L2 {err:.2e} to the CPU engine (TP=1: {base:.2e})"
                );
                assert!(err <= 1.5 * base, "{name} {tag} TP={tp}");
            }
        }
    }
}
