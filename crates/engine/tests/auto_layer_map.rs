//! The automatic layer map (`--device-layers auto`) on CPU ranks with stated device
//! memory: the layers each device holds are the ones worked out by hand below from the
//! files' sizes, and the result equals one device exactly (whole layers move, the
//! arithmetic does not change).

mod common;

use std::ops::Range;

use common::*;
use tessera_engine::{generate, DeviceLayers, DeviceMemory, DeviceSpec, Engine, EngineConfig};

const CPU0: DeviceSpec = DeviceSpec::Cpu(0);
const CPU1: DeviceSpec = DeviceSpec::Cpu(1);

/// Two CPU ranks under the automatic map, capped at `caps` bytes, with a small step (64
/// tokens, 4 sequences) so the activations the map reserves are small.
fn auto_config(path: std::path::PathBuf, caps: [usize; 2]) -> EngineConfig {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(2);
    cfg.device_layers = Some(DeviceLayers::Auto);
    cfg.device_memory = DeviceMemory {
        devices: vec![(CPU0, caps[0]), (CPU1, caps[1])],
        host: None,
    };
    cfg.max_batch_tokens = 64;
    cfg.max_num_seqs = 4;
    cfg.kv_cache_bytes = 16 << 20;
    cfg
}

fn one_device(path: std::path::PathBuf) -> Engine {
    let mut cfg = EngineConfig::new(path);
    cfg.kv_cache_bytes = 16 << 20;
    Engine::load(&cfg).expect("load on one device")
}

fn load_err(cfg: &EngineConfig) -> String {
    Engine::load(cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

fn placement(e: &Engine) -> Vec<(DeviceSpec, Range<usize>)> {
    e.layer_placement().to_vec()
}

/// Logits of a prompt and 12 greedy tokens.
fn outputs(e: &mut Engine, prompt: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let logits = last_logits(e, prompt);
    let tokens = generate(e, prompt, &greedy_opts(12, 5), |_| {}).expect("generate");
    (logits, tokens)
}

/// SmolLM2-135M Q4_1 (the default model): every projection Q4_1 (20 bytes per 32
/// weights), the tied embedding Q8_0 (34 bytes per 32), KV f32 on CPU ranks.
mod smollm2 {
    pub const LAYER_WEIGHTS: usize = (2 * 576 * 576 + 2 * 192 * 576 + 3 * 1536 * 576) / 32 * 20; // q, o; k, v; MLP
    /// 8192 positions (the model's context) of 3 KV heads of 64, keys and values, f32.
    pub const LAYER_KV: usize = 8192 / 16 * 3 * 2 * 16 * 64 * 4;
    pub const EMBEDDING: usize = 49152 * 576 / 32 * 34;
    /// The final norm beside the tied head.
    pub const HEAD: usize = EMBEDDING + 576 * 4;
    /// 64 tokens of residual, normed states, q/k/v and the MLP halves, f32.
    pub const ACTIVATIONS: usize = 64 * (4 * 576 + 2 * 1536 + (9 + 2 * 3) * 64) * 4;
    /// 4 sequences' logits over the vocabulary.
    pub const LOGITS: usize = 4 * 49152 * 4;
}

#[test]
fn smollm2_splits_over_two_devices_and_the_host_as_computed() {
    use smollm2::*;
    let layer = LAYER_WEIGHTS + LAYER_KV;
    // cpu:0 takes the embedding and as many layers as fit; cpu:1 as many again; the
    // host the rest and the head.
    let caps = [
        ACTIVATIONS + EMBEDDING + 4 * layer + 1000,
        ACTIVATIONS + 9 * layer + 5000,
    ];
    let mut staged = Engine::load(&auto_config(smollm2_path(), caps)).expect("auto map");
    assert_eq!(
        placement(&staged),
        vec![(CPU0, 0..4), (CPU1, 4..13), (CPU0, 13..30)],
        "4 layers on cpu:0, 9 on cpu:1, 17 on the host"
    );
    let prompt =
        ids(&read_json(fixtures().join("smollm2/greedy.json"))["prompts"][4]["prompt_ids"]);
    let want = outputs(&mut one_device(smollm2_path()), &prompt);
    assert_eq!(outputs(&mut staged, &prompt), want);
}

#[test]
fn the_last_device_keeps_room_for_the_head() {
    use smollm2::*;
    let layer = LAYER_WEIGHTS + LAYER_KV;
    // cpu:1 could hold the last 20 layers, but not with the head and logits: its last
    // layer goes to the host, which then holds the head.
    let caps = [
        ACTIVATIONS + EMBEDDING + 10 * layer,
        ACTIVATIONS + 20 * layer + HEAD + LOGITS - 1,
    ];
    let e = Engine::load(&auto_config(smollm2_path(), caps)).expect("auto map");
    assert_eq!(
        placement(&e),
        vec![(CPU0, 0..10), (CPU1, 10..29), (CPU0, 29..30)]
    );
    // One byte more and the devices hold everything.
    let caps = [caps[0], caps[1] + 1];
    let e = Engine::load(&auto_config(smollm2_path(), caps)).expect("auto map");
    assert_eq!(placement(&e), vec![(CPU0, 0..10), (CPU1, 10..30)]);
}

#[test]
fn a_model_the_host_cannot_hold_is_refused_with_the_numbers() {
    use smollm2::*;
    let layer = LAYER_WEIGHTS + LAYER_KV;
    let mut cfg = auto_config(
        smollm2_path(),
        [ACTIVATIONS + EMBEDDING + 4 * layer, 1 << 20],
    );
    cfg.device_memory.host = Some(10 << 20);
    let err = load_err(&cfg);
    assert!(err.contains("does not fit this machine"), "{err}");
    assert!(err.contains("layers 4..30"), "{err}");
    assert!(err.contains("has 10 MiB available"), "{err}");
    // CPU ranks share the host's memory: the map needs to be told what each may use.
    let mut cfg = EngineConfig::new(smollm2_path()).with_cpu_ranks(2);
    cfg.device_layers = Some(DeviceLayers::Auto);
    let err = load_err(&cfg);
    assert!(err.contains("--device-memory-mib"), "{err}");
    assert!(err.contains("cpu:0"), "{err}");
}

#[test]
fn weights_that_do_not_fit_by_tensor_parallelism_get_a_map_unasked() {
    use smollm2::*;
    let layer = LAYER_WEIGHTS + LAYER_KV;
    let mut cfg = auto_config(
        smollm2_path(),
        [ACTIVATIONS + EMBEDDING + 4 * layer, 1 << 20],
    );
    cfg.device_layers = None;
    let e = Engine::load(&cfg).expect("a fitted map");
    // cpu:1 holds no layer: 1 MiB is less than the activations and one layer.
    assert_eq!(placement(&e), vec![(CPU0, 0..4), (CPU0, 4..30)]);
    // Caps that hold half of every layer leave tensor parallelism in place, and so does
    // a cap on one CPU rank only (the other is bounded by nothing).
    for caps in [
        vec![(CPU0, 1 << 30), (CPU1, 1 << 30)],
        vec![(CPU0, 1 << 20)],
    ] {
        cfg.device_memory.devices = caps;
        let e = Engine::load(&cfg).expect("tensor parallel");
        assert_eq!(placement(&e), vec![(CPU0, 0..30), (CPU1, 0..30)]);
    }
}

/// tiny-qwen3-moe (f32 safetensors): three layers of hidden 64, the middle one dense;
/// the others route over 6 experts of width 40.
mod moe {
    const ATTENTION: usize = (2 * 64 * 64 + 2 * 32 * 64) * 4;
    /// Attention and the router.
    pub const MOE_DENSE: usize = ATTENTION + 6 * 64 * 4;
    pub const EXPERTS: usize = 6 * 3 * 40 * 64 * 4;
    pub const DENSE: usize = ATTENTION + 3 * 96 * 64 * 4;
    /// 512 positions of 2 KV heads of 16, keys and values, f32.
    pub const KV: usize = 512 / 16 * 2 * 2 * 16 * 16 * 4;
    pub const EMBEDDING: usize = 512 * 64 * 4;
    pub const HEAD: usize = 512 * 64 * 4 + 64 * 4;
    /// The widest MLP is the dense one (96 > 2 experts of 40).
    pub const ACTIVATIONS: usize = 64 * (4 * 64 + 2 * 96 + (4 + 2 * 2) * 16) * 4;
    pub const LOGITS: usize = 4 * 512 * 4;
}

#[test]
fn a_mixture_splits_over_two_devices_and_the_host_as_computed() {
    use moe::*;
    let path = fixtures().join("tiny-qwen3-moe");
    let prompt = [3, 17, 99, 250, 4, 41, 7];
    let want = outputs(&mut one_device(path.clone()), &prompt);
    let (l0, l1) = (MOE_DENSE + EXPERTS + KV, DENSE + KV);
    // Experts kept with their layers (--n-cpu-moe 0): layer 0 on cpu:0, layer 1 on
    // cpu:1 (layer 2 does not fit beside it), layer 2 and the head on the host.
    let mut cfg = auto_config(
        path.clone(),
        [
            ACTIVATIONS + EMBEDDING + l0 + l1 - 1,
            ACTIVATIONS + l1 + l0 - 1,
        ],
    );
    cfg.host_expert_layers = Some(0);
    let mut e = Engine::load(&cfg).expect("auto map");
    assert_eq!(
        placement(&e),
        vec![(CPU0, 0..1), (CPU1, 1..2), (CPU0, 2..3)]
    );
    assert_eq!(e.host_expert_layers(), 0);
    assert_eq!(outputs(&mut e, &prompt), want);
    // Left to the map, with room on cpu:1 for layer 2 and the head: experts kept with
    // their layers leave layer 2 to the host (cpu:1 holds layer 1 only), but with layer
    // 0's experts on the host cpu:0 also holds layer 1, and cpu:1 layer 2 and the head.
    let cpu1 = ACTIVATIONS + l0 + HEAD + LOGITS;
    let mut cfg = auto_config(path, [ACTIVATIONS + EMBEDDING + l0 + l1 - 1, cpu1]);
    cfg.host_expert_layers = None;
    let mut e = Engine::load(&cfg).expect("auto map");
    assert_eq!(placement(&e), vec![(CPU0, 0..2), (CPU1, 2..3)]);
    assert_eq!(e.host_expert_layers(), 1);
    assert_eq!(outputs(&mut e, &prompt), want);
}

#[test]
fn experts_on_the_host_need_a_mixture_and_a_gpu() {
    let mut cfg = EngineConfig::new(fixtures().join("tiny-qwen3-moe"));
    cfg.host_expert_layers = Some(usize::MAX);
    let err = load_err(&cfg);
    assert!(err.contains("CPU ranks"), "{err}");
    let mut cfg = EngineConfig::new(fixtures().join("tiny-llama"));
    cfg.host_expert_layers = Some(2);
    let err = load_err(&cfg);
    assert!(err.contains("no mixture-of-experts layers"), "{err}");
}
