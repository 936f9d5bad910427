//! Decode-step timing of one model on one GPU (not a check: `scripts/profile-gpu` runs it,
//! alone and under Nsight Compute). For each batch size, sequences of a short prompt are
//! prefilled, then decoded greedily through the serving path (`Executor::step`, arg-max
//! on the GPU); each step is timed on the host. With `TESSERA_PROFILE_RANGE=1` the steps
//! of the first batch size after the warm-up are wrapped in cuProfilerStart/Stop, so a
//! profiler started with `--profile-from-start off` sees exactly those kernels.

use std::time::Instant;

use candle_core::cuda::cudarc::driver::{profiler_start, profiler_stop};
use tessera_engine::{DeviceSpec, Engine, EngineConfig};
use tessera_protocol::{Executor, NewSequence, SamplingParams, ScheduledChunk, SeqId, StepPlan};

use crate::report::gpu;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
#[ignore = "run by scripts/profile-gpu"]
fn decode_step_profile() {
    let path = std::env::var("TESSERA_BENCH_MODEL").expect("TESSERA_BENCH_MODEL: a model");
    let batches: Vec<usize> = std::env::var("TESSERA_PROFILE_BATCHES")
        .unwrap_or_else(|_| "1,16,64".into())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect();
    let steps = env_usize("TESSERA_PROFILE_STEPS", 100);
    let ranged = std::env::var("TESSERA_PROFILE_RANGE").is_ok_and(|v| v == "1");
    let mut cfg = EngineConfig::new(&path);
    cfg.devices = vec![DeviceSpec::Cuda(0)];
    cfg.kv_cache_bytes = 2 << 30;
    let t = Instant::now();
    let mut engine = Engine::load(&cfg).expect("load");
    println!("loaded {path} in {:.1} s", t.elapsed().as_secs_f64());
    // The profiler API acts on the calling thread's context: bind the device's.
    let _device = gpu();
    let bs = engine.kv_cache_shape().block_size_tokens;
    let prompt_len = 16;
    let blocks_per_seq = (prompt_len + steps + 8).div_ceil(bs);
    let mut next_id = 1u64;
    for (round, &batch) in batches.iter().enumerate() {
        let ids: Vec<SeqId> = (0..batch).map(|i| SeqId(next_id + i as u64)).collect();
        next_id += batch as u64;
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|i| ((i * blocks_per_seq) as u32..((i + 1) * blocks_per_seq) as u32).collect())
            .collect();
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|i| {
                (0..prompt_len)
                    .map(|j| (100 + 7 * i + 13 * j) as u32)
                    .collect()
            })
            .collect();
        let plan = StepPlan {
            new_sequences: ids
                .iter()
                .zip(&prompts)
                .map(|(id, p)| NewSequence {
                    id: *id,
                    sampling: SamplingParams::greedy(),
                    prompt_ids: p.clone(),
                })
                .collect(),
            scheduled: ids
                .iter()
                .zip(&prompts)
                .zip(&tables)
                .map(|((id, p), table)| ScheduledChunk {
                    id: *id,
                    tokens: p.clone(),
                    start_pos: 0,
                    block_table: table.clone(),
                    sample: true,
                    num_draft: 0,
                    propose: 0,
                    group_tables: Vec::new(),
                })
                .collect(),
            finished: vec![],
        };
        let mut out = engine.step(&plan).expect("prefill");
        let mut times = Vec::with_capacity(steps);
        for step in 0..steps {
            if ranged && round == 0 && step == 10 {
                profiler_start().expect("cuProfilerStart");
            }
            let plan = StepPlan {
                new_sequences: vec![],
                scheduled: out
                    .samples
                    .iter()
                    .zip(&tables)
                    .map(|(s, table)| ScheduledChunk {
                        id: s.id,
                        tokens: vec![s.token],
                        start_pos: prompt_len + step,
                        block_table: table.clone(),
                        sample: true,
                        num_draft: 0,
                        propose: 0,
                        group_tables: Vec::new(),
                    })
                    .collect(),
                finished: vec![],
            };
            let t = Instant::now();
            out = engine.step(&plan).expect("decode step");
            times.push(t.elapsed().as_secs_f64() * 1e3);
            if ranged && round == 0 && step == 12 {
                profiler_stop().expect("cuProfilerStop");
            }
        }
        let finished = StepPlan {
            new_sequences: vec![],
            scheduled: vec![],
            finished: ids.clone(),
        };
        engine.step(&finished).expect("finish");
        times.sort_by(f64::total_cmp);
        let q = |f: f64| times[((times.len() - 1) as f64 * f) as usize];
        println!(
            "PROFILE | batch {batch} | step ms median {:.3} p10 {:.3} p90 {:.3} | {:.1} tok/s per sequence",
            q(0.5),
            q(0.1),
            q(0.9),
            1e3 / q(0.5)
        );
    }
}
