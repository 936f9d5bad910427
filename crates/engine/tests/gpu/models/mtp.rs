//! GLM-4.5's multi-token-prediction layer on CUDA ranks (`--speculative-config` method
//! `mtp`): a random GLM-4.5 with its layer in the shape the CUDA kernels take
//! (`tessera_engine::test_models`, from the tensor names of the fixture
//! `tests/fixtures/models/tiny-glm4-moe-mtp`, whose `model.safetensors` must reach the GPU
//! machine whole), on `cuda:0`
//! and at TP = 2 on one GPU, against the CPU engine on the same weights (which
//! `tests/glm4_moe_mtp.rs` holds to the torch reference). One sequence per prompt runs
//! step after step, each step scoring the previous step's three guesses and asking for
//! three more. The CUDA ranks compute in bf16 where the CPU engine computes in f32, so a
//! near tie may go the other way: the steps are compared while both runs' texts agree,
//! and at least 90% of the compared steps must make the same guesses.

use std::path::PathBuf;

use tessera_engine::{test_models, Engine, EngineConfig};
use tessera_protocol::{NewSequence, SamplingParams, StepPlan};

use super::{devices, models_dir, selected};
use crate::common::fixtures;
use crate::common::one_sequence::{self, finish, only_sample, SEQ};
use crate::report::check;

const FIXTURE: &str = "tiny-glm4-moe-mtp";
const GUESSES: usize = 3;
const STEPS: usize = 24;
const MIN_AGREEING: f64 = 0.9;
const MIN_COMPARED: usize = 16;

/// The model, written beside the other check models. The fixture's folder is the
/// repository's as `scripts/test-gpu` names it (`TESSERA_GPU_FIXTURES`), else the one
/// this binary was built from.
fn model() -> PathBuf {
    let out = models_dir().join(FIXTURE);
    let fixtures = std::env::var("TESSERA_GPU_FIXTURES").map_or_else(|_| fixtures(), PathBuf::from);
    let dims = test_models::gpu_shaped(FIXTURE).expect("dimensions");
    test_models::write(&fixtures.join(FIXTURE), &out, &dims, 20261128)
        .unwrap_or_else(|e| panic!("{FIXTURE}: {e}"));
    out
}

fn engine(path: &std::path::Path, spec: &str) -> Engine {
    let mut cfg = EngineConfig::new(path);
    cfg.devices = devices(spec);
    cfg.kv_cache_bytes = 64 << 20;
    cfg.mtp = true;
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Each step's emitted tokens and guesses, the sequence `prompt` alone.
fn steps(engine: &mut Engine, prompt: &[u32]) -> Vec<(Vec<u32>, Vec<u32>)> {
    let blocks: Vec<u32> =
        (0..(prompt.len() + STEPS * (GUESSES + 1)).div_ceil(16) as u32 + 1).collect();
    let chunk = |tokens: Vec<u32>, start_pos, num_draft| {
        one_sequence::chunk(tokens, start_pos, num_draft, GUESSES, &blocks)
    };
    let first = StepPlan {
        new_sequences: vec![NewSequence {
            id: SEQ,
            sampling: SamplingParams::greedy(),
            prompt_ids: prompt.to_vec(),
        }],
        scheduled: vec![chunk(prompt.to_vec(), 0, 0)],
        finished: Vec::new(),
    };
    let mut s = only_sample(engine, &first);
    let mut len = prompt.len();
    let mut out = Vec::new();
    for _ in 0..STEPS {
        let emitted: Vec<u32> = std::iter::once(s.token)
            .chain(s.accepted.iter().map(|(t, _)| *t))
            .collect();
        let last = *emitted.last().expect("a token");
        len += emitted.len();
        out.push((emitted, s.proposed.clone()));
        let mut tokens = vec![last];
        tokens.extend(&s.proposed);
        let plan = StepPlan {
            scheduled: vec![chunk(tokens, len - 1, s.proposed.len())],
            ..StepPlan::default()
        };
        s = only_sample(engine, &plan);
    }
    finish(engine);
    out
}

#[test]
fn cuda_mtp_guesses_match_the_cpu_engine() {
    if !selected("glm4-moe-mtp") {
        return;
    }
    let path = model();
    let mut cpu = engine(&path, "cpu:0");
    let vocab = cpu.model_config().vocab_size;
    let mut rng = tessera_kernels::gpu::reference::Lcg(5);
    let prompts: Vec<Vec<u32>> = [7, 40]
        .iter()
        .map(|n| (0..*n).map(|_| rng.below(vocab) as u32).collect())
        .collect();
    let want: Vec<_> = prompts.iter().map(|p| steps(&mut cpu, p)).collect();
    drop(cpu);
    for spec in ["cuda:0", "cuda:0,cuda:0"] {
        let mut gpu = engine(&path, spec);
        let (mut compared, mut agreeing) = (0, 0);
        for (prompt, want) in prompts.iter().zip(&want) {
            let got = steps(&mut gpu, prompt);
            for ((g_tokens, g_guesses), (w_tokens, w_guesses)) in got.iter().zip(want) {
                if g_tokens != w_tokens {
                    break;
                }
                compared += 1;
                agreeing += usize::from(g_guesses == w_guesses);
            }
        }
        let share = agreeing as f64 / compared.max(1) as f64;
        check(
            &format!("glm4-moe-mtp bf16: MTP guesses on {spec} against the CPU engine"),
            format!("{agreeing} of {compared} steps guess alike while the texts agree"),
            format!(">= {MIN_AGREEING} of >= {MIN_COMPARED} steps"),
            share >= MIN_AGREEING && compared >= MIN_COMPARED,
        );
    }
}
