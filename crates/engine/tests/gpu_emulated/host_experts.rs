//! `--cpu-moe` and `--n-cpu-moe` on the GPU path: the routed experts of some layers stay
//! on the host and run there, on the hidden states copied over once per layer, while
//! attention, dense layers, the router and a shared expert stay on the device. The
//! logits are those of the run with every expert on the device, within the bound that
//! bf16 device matmuls against f32 host matmuls allow, and greedy text agrees.

use std::path::Path;

use tessera_engine::{Engine, EngineConfig};

use super::{model, prompts, served_greedy_with_gaps, TP_BOUND};
use crate::common::{agree_until_tie, last_logits, rel_l2};

fn gpu_path(path: &Path, host_expert_layers: Option<usize>) -> Engine {
    let mut cfg = EngineConfig::new(path);
    cfg.emulate_gpu = true;
    cfg.kv_cache_bytes = 32 << 20;
    cfg.host_expert_layers = host_expert_layers;
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn experts_on_the_host_give_the_logits_of_experts_on_the_device() {
    for fixture in [
        "tiny-qwen3-moe",
        "tiny-mixtral",
        "tiny-gpt-oss",
        "tiny-glm4-moe",
    ] {
        let path = model(fixture);
        let mut device = gpu_path(&path, None);
        let config = device.model_config().clone();
        let vocab = config.vocab_size;
        let prompts = prompts(vocab);
        let want: Vec<Vec<f32>> = prompts
            .iter()
            .map(|p| last_logits(&mut device, p))
            .collect();
        let greedy = served_greedy_with_gaps(&mut device, &prompts[1], 8);
        drop(device);
        // Every layer's experts (--cpu-moe), then those of the first mixture layer only
        // (--n-cpu-moe: GLM-4.5's first layer is dense).
        let first_moe = (0..config.num_layers)
            .find(|l| config.is_moe_layer(*l))
            .expect("a mixture layer");
        for (label, host) in [("--cpu-moe", usize::MAX), ("--n-cpu-moe", first_moe + 1)] {
            let mut e = gpu_path(&path, Some(host));
            assert_eq!(e.host_expert_layers(), host.min(config.num_layers));
            for (prompt, want) in prompts.iter().zip(&want) {
                let err = rel_l2(&last_logits(&mut e, prompt), want);
                let what = format!("{fixture} {label}, prompt of {}: {err:.2e}", prompt.len());
                assert!(err < TP_BOUND, "{what}");
                // Not the device's own numbers: the host's f32 experts really ran.
                assert!(err > 1e-5, "{what}");
            }
            let tokens = served_greedy_with_gaps(&mut e, &prompts[1], 8).0;
            let (n, same) = agree_until_tie(&greedy, &tokens, 0.02);
            assert!(same, "{fixture} {label}: {tokens:?} against {:?}", greedy.0);
            assert!(n > 0, "{fixture}: no token compared");
        }
    }
}
