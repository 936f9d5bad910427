//! Layer maps: whole layers on different devices (CPU ranks here), host layers last.
//! Placing layers does not change the arithmetic, so results equal one device exactly.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tessera_engine::{
    generate, DeviceSpec, Engine, EngineConfig, Fault, GenerateOptions, LayerMap,
};
use tessera_protocol::{FailureScope, SamplingParams};

fn engine(path: std::path::PathBuf, map: Option<&str>) -> Engine {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(if map.is_some() { 2 } else { 1 });
    cfg.kv_cache_bytes = 32 << 20;
    cfg.device_layers = map.map(|m| m.parse::<LayerMap>().expect("layer map").into());
    Engine::load(&cfg).expect("load")
}

fn greedy(
    engine: &mut Engine,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<u32>, tessera_protocol::ExecutorError> {
    let opts = GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        stop_token_ids: vec![],
        prefill_chunk: 5,
    };
    generate(engine, prompt, &opts, |_| {})
}

#[test]
fn smollm2_layer_maps_equal_one_device_exactly() {
    let prompt =
        ids(&read_json(fixtures().join("smollm2/greedy.json"))["prompts"][4]["prompt_ids"]);
    let mut one = engine(smollm2_path(), None);
    let want_logits = last_logits(&mut one, &prompt);
    let want = greedy(&mut one, &prompt, 16).expect("generate");
    drop(one);
    // Two device stages; one device stage plus host layers.
    for map in ["0:16;1:14", "1:10"] {
        let mut staged = engine(smollm2_path(), Some(map));
        assert_eq!(
            last_logits(&mut staged, &prompt),
            want_logits,
            "{map}: logits"
        );
        assert_eq!(
            greedy(&mut staged, &prompt, 16).expect("generate"),
            want,
            "{map}: tokens"
        );
    }
}

#[test]
fn bad_layer_maps_are_refused_with_the_fix() {
    let dir = fixtures().join("tiny-llama");
    let mut cfg = EngineConfig::new(&dir).with_cpu_ranks(2);
    cfg.device_layers = Some("0:2;1:1".parse().expect("syntax is fine"));
    let err = Engine::load(&cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("the model has 2") && err.contains("at most 2"),
        "{err}"
    );
    cfg.device_layers = Some("0:1;3:1".parse().expect("syntax is fine"));
    cfg.devices = vec![DeviceSpec::Cpu(0), DeviceSpec::Cpu(1)];
    let err = Engine::load(&cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("ordinal 3 is not among the devices (cpu:0, cpu:1)"),
        "{err}"
    );
}

/// A stage that fails releases the stages after it: the step fails fast, naming it,
/// and the stages serve the next step.
#[test]
fn a_failing_stage_surfaces_as_an_error_naming_it() {
    for fault in [Fault::Error, Fault::Panic] {
        let mut cfg = EngineConfig::new(fixtures().join("tiny-llama")).with_cpu_ranks(2);
        cfg.kv_cache_bytes = 4 << 20;
        cfg.step_timeout = Duration::from_secs(20);
        cfg.device_layers = Some("0:1;1:1".parse().expect("map"));
        let mut engine = Engine::load(&cfg).expect("load");
        let want = greedy(&mut engine, &[4, 5, 6], 2).expect("runs");
        engine.inject_fault(0, fault).expect("inject");
        let started = Instant::now();
        let err = greedy(&mut engine, &[4, 5, 6], 2).expect_err("must fail");
        assert_eq!(err.rank, Some(0), "{fault:?}: {err}");
        assert_eq!(err.scope, FailureScope::Step, "{fault:?}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{fault:?} was not released promptly"
        );
        assert_eq!(
            greedy(&mut engine, &[4, 5, 6], 2).expect("runs again"),
            want
        );
    }
}

/// With three stages and more, every stage after a failing one hears of it at once
/// (not only the next one: the last would wait out the whole step timeout), whichever
/// stage fails; and the pipeline then gives the tokens it gave before.
#[test]
fn every_stage_after_a_failing_one_is_released() {
    let prompt = [1, 9038, 2501, 263, 48, 260];
    let mut reference: Option<Vec<u32>> = None;
    // Three stages (two device stages and the host), four, five.
    for map in ["0:10;1:10", "0:8;1:8;2:8", "0:6;1:6;2:6;3:6"] {
        let layer_map: LayerMap = map.parse().expect("map");
        let stages = map.split(';').count() + 1;
        let mut cfg = EngineConfig::new(smollm2_path()).with_cpu_ranks(stages - 1);
        cfg.kv_cache_bytes = 16 << 20;
        cfg.step_timeout = Duration::from_secs(30);
        cfg.threads_per_rank = Some(1);
        cfg.device_layers = Some(layer_map.into());
        let mut engine = Engine::load(&cfg).expect("load");
        let want = greedy(&mut engine, &prompt, 3).expect("runs");
        if let Some(r) = &reference {
            assert_eq!(&want, r, "{map}: placing layers changes nothing");
        }
        reference = Some(want.clone());
        // The first stage, and one in the middle.
        for failing in [0, stages / 2] {
            engine.inject_fault(failing, Fault::Error).expect("inject");
            let started = Instant::now();
            let err = greedy(&mut engine, &prompt, 3).expect_err("must fail");
            let took = started.elapsed();
            println!("{map}: stage {failing} failed: {err} after {took:?}");
            assert_eq!(err.rank, Some(failing), "{map}: {err}");
            assert_eq!(err.scope, FailureScope::Step, "{map}: {err}");
            assert!(
                took < Duration::from_secs(10),
                "{map}: stage {failing}'s failure took {took:?} to reach the last stage"
            );
            assert_eq!(
                greedy(&mut engine, &prompt, 3).expect("runs again"),
                want,
                "{map}"
            );
        }
    }
}

/// Stages that are tensor-parallel groups: each stage's ranks split its layers, rank r
/// hands its hidden states to rank r of the next stage, and the host's stage has as many
/// CPU ranks. The arithmetic of each layer is that of tensor parallelism over two ranks,
/// so the results equal TP = 2 exactly.
#[test]
fn stages_of_tensor_parallel_groups_equal_tensor_parallelism_exactly() {
    let prompt =
        ids(&read_json(fixtures().join("smollm2/greedy.json"))["prompts"][4]["prompt_ids"]);
    let mut tp = EngineConfig::new(smollm2_path()).with_cpu_ranks(2);
    tp.kv_cache_bytes = 16 << 20;
    tp.threads_per_rank = Some(1);
    let mut tp = Engine::load(&tp).expect("TP = 2");
    let want_logits = last_logits(&mut tp, &prompt);
    let want = greedy(&mut tp, &prompt, 8).expect("generate");
    drop(tp);
    let mut cfg = EngineConfig::new(smollm2_path()).with_cpu_ranks(4);
    cfg.kv_cache_bytes = 16 << 20;
    cfg.threads_per_rank = Some(1);
    cfg.step_timeout = Duration::from_secs(30);
    // Two device groups and the host's group of two CPU ranks.
    cfg.device_layers = Some("2,3:12;0,1:10".parse().expect("map"));
    let mut staged = Engine::load(&cfg).expect("load");
    let placed: Vec<(DeviceSpec, std::ops::Range<usize>)> = staged.layer_placement().to_vec();
    let cpu = DeviceSpec::Cpu;
    assert_eq!(
        placed,
        vec![
            (cpu(2), 0..12),
            (cpu(3), 0..12),
            (cpu(0), 12..22),
            (cpu(1), 12..22),
            (cpu(0), 22..30),
            (cpu(1), 22..30),
        ]
    );
    assert_eq!(last_logits(&mut staged, &prompt), want_logits);
    assert_eq!(greedy(&mut staged, &prompt, 8).expect("generate"), want);
    // A rank that fails in the second rank of a group releases its group and every
    // stage after it at once (not after the step timeout), and the next step runs.
    for failing in [1, 2, 5] {
        staged.inject_fault(failing, Fault::Error).expect("inject");
        let started = Instant::now();
        let err = greedy(&mut staged, &prompt, 3).expect_err("must fail");
        let took = started.elapsed();
        assert_eq!(err.rank, Some(failing), "{err}");
        assert_eq!(err.scope, FailureScope::Step, "{err}");
        assert!(took < Duration::from_secs(10), "rank {failing}: {took:?}");
        assert_eq!(
            greedy(&mut staged, &prompt, 8).expect("runs again"),
            want,
            "after rank {failing} failed"
        );
    }
}
