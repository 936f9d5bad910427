//! Fitting models to the GPU: `--device-layers auto` under a `--device-memory-mib` cap
//! below the model's size, and the routed experts on the host (`--cpu-moe`,
//! `--n-cpu-moe`), each against the CPU engine within the CUDA bound.

use std::path::Path;

use tessera_engine::{DeviceLayers, DeviceMemory, DeviceSpec, Engine, EngineConfig};

use super::{devices, each_model, engine, models};
use crate::common::{gpu_check_prompts, last_logits, rel_l2, GPU_LOGITS_BOUND};
use crate::report::check;

/// The worst relative L2 distance of `e`'s logits from the CPU engine's over the check
/// prompts.
fn worst_against_cpu(e: &mut Engine, path: &Path, ref_dir: &Path) -> f32 {
    let mut cpu = engine(path, "cpu:0");
    let vocab = cpu.model_config().vocab_size;
    gpu_check_prompts(ref_dir, vocab)
        .iter()
        .map(|p| rel_l2(&last_logits(e, p), &last_logits(&mut cpu, p)))
        .fold(0f32, f32::max)
}

fn capped(path: &Path, mib: usize, host_expert_layers: Option<usize>) -> EngineConfig {
    let mut cfg = EngineConfig::new(path);
    cfg.devices = devices("cuda:0");
    cfg.device_layers = Some(DeviceLayers::Auto);
    cfg.device_memory = DeviceMemory {
        devices: vec![(DeviceSpec::Cuda(0), mib << 20)],
        host: None,
    };
    cfg.max_batch_tokens = 256;
    cfg.max_num_seqs = 8;
    cfg.max_model_len = Some(1024);
    cfg.kv_cache_bytes = 64 << 20;
    cfg.host_expert_layers = host_expert_layers;
    cfg
}

/// The smallest cap (in MiB, growing by 4) under which the map keeps some layers on the
/// GPU and leaves some to the host, with the engine it loaded.
fn spilling(path: &Path, host_expert_layers: Option<usize>) -> Option<(usize, Engine)> {
    (1..256).map(|k| 4 * k).find_map(|mib| {
        let e = Engine::load(&capped(path, mib, host_expert_layers)).ok()?;
        let p = e.layer_placement();
        let on_gpu = p.iter().any(|(d, _)| matches!(d, DeviceSpec::Cuda(_)));
        (on_gpu && p.len() > 1).then_some((mib, e))
    })
}

#[test]
fn an_automatic_map_under_a_cap_spills_layers_to_the_host() {
    let chosen = models()
        .iter()
        .filter(|m| m.0 == "llama bf16" || m.0 == "qwen3-moe bf16");
    each_model(chosen, |(label, path, ref_dir)| {
        // Experts kept with their layers: whole layers spill.
        let Some((mib, mut e)) = spilling(path, Some(0)) else {
            panic!("{label}: no cap up to 1 GiB splits the model between cuda:0 and the host");
        };
        let placed = format!("{:?}", e.layer_placement());
        let worst = worst_against_cpu(&mut e, path, ref_dir);
        check(
            &format!("{label}: --device-layers auto --device-memory-mib cuda:0={mib} ({placed}) against the CPU engine"),
            format!("rel L2 {worst:.2e}"),
            format!("< {GPU_LOGITS_BOUND:.0e}"),
            worst < GPU_LOGITS_BOUND,
        );
    });
}

#[test]
fn experts_on_the_host_match_the_cpu_engine() {
    let chosen = models()
        .iter()
        .filter(|m| ["qwen3-moe bf16", "glm4-moe bf16", "gpt-oss bf16"].contains(&m.0.as_str()));
    each_model(chosen, |(label, path, ref_dir)| {
        for (flag, n) in [("--cpu-moe", usize::MAX), ("--n-cpu-moe 2", 2)] {
            let mut cfg = EngineConfig::new(path);
            cfg.devices = devices("cuda:0");
            cfg.kv_cache_bytes = 64 << 20;
            cfg.host_expert_layers = Some(n);
            let mut e = Engine::load(&cfg).unwrap_or_else(|err| panic!("{label} {flag}: {err}"));
            let worst = worst_against_cpu(&mut e, path, ref_dir);
            check(
                &format!("{label}: {flag} (routed experts on the host) against the CPU engine"),
                format!("rel L2 {worst:.2e}"),
                format!("< {GPU_LOGITS_BOUND:.0e}"),
                worst < GPU_LOGITS_BOUND,
            );
        }
        // Left to the map under a cap: experts move to the host before whole layers.
        if let Some((mib, mut e)) = spilling(path, None).or_else(|| {
            // Every layer fits once experts are on the host: the smallest cap that fits.
            (1..256).map(|k| 4 * k).find_map(|mib| {
                let e = Engine::load(&capped(path, mib, None)).ok()?;
                (e.host_expert_layers() > 0).then_some((mib, e))
            })
        }) {
            let experts = e.host_expert_layers();
            let placed = format!("{:?}", e.layer_placement());
            let worst = worst_against_cpu(&mut e, path, ref_dir);
            check(
                &format!("{label}: --device-layers auto --device-memory-mib cuda:0={mib}: experts of {experts} layers on the host, {placed}"),
                format!("rel L2 {worst:.2e}"),
                format!("< {GPU_LOGITS_BOUND:.0e}"),
                worst < GPU_LOGITS_BOUND && experts > 0,
            );
        }
    });
}
