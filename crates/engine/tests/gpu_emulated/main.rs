//! The CUDA ranks' forward pass on the host (`EngineConfig::emulate_gpu`): the same
//! Rust code as on a GPU — the step's packed metadata, our kernels launched from the same
//! argument lists (checked against each kernel's signature), the paged KV cache of the
//! GPU path, bf16 activations with f32 residuals, the arg-max and sampling candidates
//! reduced by kernels — with the kernels compiled as C++ and run on CPU fibers.
//! What differs from a GPU: candle's host matmuls stand in for cuBLAS, and the weights
//! stay f32 (these models are stored in bf16, so they are the same values).
//!
//! Each model is a random-weight model of a fixture's architecture, in the head
//! dimensions the kernels serve. Bounds are those of the GPU checks
//! (`crates/engine/tests/gpu/models.rs`): bf16 activations move logits by about 1e-2
//! relative to the CPU engine's f32, and greedy text is compared up to the CPU engine's
//! first near tie.

mod batched;
#[path = "../common/mod.rs"]
mod common;
mod decode_graphs;
mod embeddings;
mod host_experts;
mod kv_8bit;

use std::path::{Path, PathBuf};

use common::{agree_until_tie, greedy_opts, last_logits, rel_l2};
use tessera_engine::{
    generate, generate_sampled, test_models, Engine, EngineConfig, GenerateOptions,
};
use tessera_kernels::gpu::reference::Lcg;
use tessera_protocol::{SamplingParams, TokenLogprobs};

const LOGITS_BOUND: f32 = 2e-2;
const TP_BOUND: f32 = 1e-2;

fn engine(path: &Path, ranks: usize, emulate_gpu: bool) -> Engine {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(ranks);
    cfg.emulate_gpu = emulate_gpu;
    cfg.kv_cache_bytes = 32 << 20;
    Engine::load(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A random-weight model of the fixture's architecture in GPU head dimensions
/// (`tessera_engine::test_models`), written once under the target directory.
fn model(fixture: &str) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gpu-emulated-{fixture}"));
    let dims = test_models::gpu_shaped(fixture).expect("dimensions");
    test_models::write(&common::fixtures().join(fixture), &out, &dims, 20261124)
        .unwrap_or_else(|e| panic!("{fixture}: {e}"));
    out
}

const MODELS: [&str; 20] = [
    "tiny-llama",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-mistral",
    "tiny-gemma3",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-qwen3-yarn",
    "tiny-gemma3-linear",
    "tiny-phi3",
    "tiny-smollm3",
    "tiny-gemma2",
    "tiny-phi4-mini",
    "tiny-granite",
    "tiny-glm4",
    "tiny-olmo2",
    "tiny-gpt-oss",
    "tiny-glm4-moe",
    "tiny-olmo3",
    "tiny-minimax-m2",
];

/// Random prompts: a short one, one of several KV blocks, and one long enough that
/// decoding splits the context into partitions.
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = Lcg(7);
    [5, 37, 300]
        .iter()
        .map(|n| (0..*n).map(|_| rng.below(vocab) as u32).collect())
        .collect()
}

/// The tokens `engine` generates greedily, with the top-2 logit gap before each (from
/// the logits of the prefix, one full forward pass per token).
fn greedy_with_gaps(engine: &mut Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut seq = prompt.to_vec();
    let (mut tokens, mut gaps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let logits = last_logits(engine, &seq);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
        gaps.push(logits[order[0]] - logits[order[1]]);
        tokens.push(order[0] as u32);
        seq.push(order[0] as u32);
    }
    (tokens, gaps)
}

/// The tokens `engine` generates greedily over its KV cache, with the top-2 logit gap
/// before each: the difference of the two most likely tokens' log-probabilities, which is
/// their logits'. One prefill and a decode step per token, where [`greedy_with_gaps`]
/// runs a whole forward pass per token (too slow on an emulated rank's long prompts).
fn served_greedy_with_gaps(engine: &mut Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let opts = GenerateOptions {
        sampling: SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy()
        },
        ..greedy_opts(n, 0)
    };
    let mut gaps = Vec::new();
    let tokens = generate_sampled(engine, prompt, &opts, |s| {
        if let Some(l) = &s.logprobs {
            gaps.push(match l.top.as_slice() {
                [a, b, ..] => a.1 - b.1,
                _ => f32::INFINITY,
            });
        }
    })
    .expect("generate");
    assert_eq!(gaps.len(), tokens.len(), "a gap before every token");
    (tokens, gaps)
}

#[test]
fn gpu_path_logits_and_greedy_text_match_the_cpu_engine() {
    // Random mixtures of experts meet near ties early: count compared tokens overall.
    let mut compared = 0;
    for fixture in MODELS {
        let path = model(fixture);
        let mut cpu = engine(&path, 1, false);
        let mut gpu = engine(&path, 1, true);
        let vocab = cpu.model_config().vocab_size;
        for prompt in prompts(vocab) {
            let want = last_logits(&mut cpu, &prompt);
            let got = last_logits(&mut gpu, &prompt);
            let err = rel_l2(&got, &want);
            println!("{fixture}: prompt of {}: rel L2 {err:.2e}", prompt.len());
            assert!(
                err < LOGITS_BOUND,
                "{fixture}, prompt of {}: GPU-path logits {err:.2e} from the CPU engine's",
                prompt.len()
            );
            // The serving path: prefill in chunks (of 7, crossing KV blocks at odd places;
            // of 64 for the long prompt, whose decoding splits its context), the arg-max
            // reduced by the kernel.
            let reference = greedy_with_gaps(&mut cpu, &prompt, 8);
            let chunk = if prompt.len() > 100 { 64 } else { 7 };
            let served = generate(&mut gpu, &prompt, &greedy_opts(8, chunk), |_| {})
                .unwrap_or_else(|e| panic!("{fixture}: generate: {e}"));
            let (n, same) = agree_until_tie(&reference, &served, 0.1);
            assert!(
                same,
                "{fixture}, prompt of {}: GPU path {served:?}, CPU engine {:?} (gaps {:?})",
                prompt.len(),
                reference.0,
                reference.1
            );
            compared += n;
        }
    }
    assert!(compared >= 64, "only {compared} greedy tokens compared");
}

/// Over many rows bf16 activations have a tail: the bound is on the mean, and the worst
/// row may reach 5e-2. In a mixture, bf16 can also tip a token whose two best experts are
/// nearly tied to the other one, and every later row of its sequence attends to the
/// changed keys: 1e-1 there. Wrong block tables or stale blocks move rows by far more.
#[test]
fn batched_steps_match_the_cpu_engine_row_by_row() {
    for (fixture, ranks, mean_bound, worst_bound) in [
        ("tiny-llama", 1, 1.5e-2, 5e-2),
        ("tiny-gemma3", 2, 1.5e-2, 5e-2),
        ("tiny-qwen3-moe", 1, 2e-2, 1e-1),
    ] {
        let path = model(fixture);
        let mut cpu = engine(&path, 1, false);
        let mut gpu = engine(&path, ranks, true);
        let c = batched::run(&path, &mut gpu, &mut cpu);
        let rows = c.errors.len();
        let mean = c.errors.iter().sum::<f32>() / rows.max(1) as f32;
        let worst = c.errors.iter().copied().fold(0f32, f32::max);
        println!(
            "{fixture} TP={ranks}: {rows} rows, rel L2 mean {mean:.2e}, worst {worst:.2e}; \
             {} of {} clear choices differ",
            c.differ, c.choices
        );
        assert!(rows >= 30, "{fixture}: {rows} rows");
        assert!(
            mean < mean_bound && worst < worst_bound,
            "{fixture}: rel L2 mean {mean:.2e}, worst {worst:.2e}"
        );
        assert!(
            c.choices >= 15 && c.differ == 0,
            "{fixture}: {} of {} greedy choices differ",
            c.differ,
            c.choices
        );
    }
}

#[test]
fn gpu_path_tensor_parallel_equals_tp1() {
    let mut compared = 0;
    for fixture in [
        "tiny-llama",
        "tiny-qwen3",
        "tiny-mixtral",
        "tiny-gpt-oss",
        "tiny-glm4-moe",
        // Query/key norms across heads: at TP = 3 a replicated KV head's squares count
        // once in the all-reduced sum.
        "tiny-olmo2",
        // Not tiny-minimax-m2: its model of this seed meets a routing near tie on the
        // 37-token prompt at TP = 3 that bf16 tips (0.57); models of seeds 1 to 4 stay
        // within 7.1e-3 of TP = 1 on all three prompts at TP = 2 and 3.
    ] {
        let path = model(fixture);
        let mut tp1 = engine(&path, 1, true);
        let vocab = tp1.model_config().vocab_size;
        let prompt = prompts(vocab).swap_remove(1);
        let base_logits = last_logits(&mut tp1, &prompt);
        let base = greedy_with_gaps(&mut tp1, &prompt, 8);
        drop(tp1);
        for tp in [2, 3] {
            let mut e = engine(&path, tp, true);
            let logits = last_logits(&mut e, &prompt);
            let diff = rel_l2(&logits, &base_logits);
            assert!(
                diff < TP_BOUND,
                "{fixture} TP={tp}: logits {diff:.2e} from TP=1"
            );
            let tokens = generate(&mut e, &prompt, &greedy_opts(8, 0), |_| {}).expect("generate");
            let (n, same) = agree_until_tie(&base, &tokens, 0.02);
            assert!(
                same,
                "{fixture} TP={tp}: {tokens:?} against TP=1 {:?}",
                base.0
            );
            compared += n;
        }
    }
    assert!(compared >= 24, "only {compared} greedy tokens compared");
}

#[test]
fn a_layer_map_runs_gpu_path_stages_before_host_layers() {
    // Three of the six layers take the GPU path on cpu:0, the rest are the host's.
    let path = model("tiny-gemma3");
    let mut cfg = EngineConfig::new(&path);
    cfg.emulate_gpu = true;
    cfg.device_layers = Some("0:3".parse().expect("layer map"));
    cfg.kv_cache_bytes = 32 << 20;
    let mut mixed = Engine::load(&cfg).expect("layers 0-2 on the GPU path, 3-5 on the host");
    let mut cpu = engine(&path, 1, false);
    for prompt in prompts(cpu.model_config().vocab_size) {
        let want = last_logits(&mut cpu, &prompt);
        let got = last_logits(&mut mixed, &prompt);
        let err = rel_l2(&got, &want);
        assert!(err < LOGITS_BOUND, "prompt of {}: {err:.2e}", prompt.len());
        // Not the CPU engine's own numbers: the first stage really ran in bf16.
        assert!(err > 1e-4, "prompt of {}: {err:.2e}", prompt.len());
    }
}

/// `sampling` run twice on `e` after `prompt`: as it is (rows reduced on the device) and
/// with a logit bias of 0 (which makes the host take whole rows). Each run's tokens and
/// log-probabilities (none unless `sampling` asks for them).
fn reduced_and_whole(
    e: &mut Engine,
    prompt: &[u32],
    sampling: SamplingParams,
    max_tokens: usize,
) -> [(Vec<u32>, Vec<TokenLogprobs>); 2] {
    [vec![], vec![(0, 0.0)]].map(|logit_bias| {
        let opts = GenerateOptions {
            sampling: SamplingParams {
                logit_bias,
                ..sampling.clone()
            },
            ..greedy_opts(max_tokens, 0)
        };
        let mut scores = Vec::new();
        let tokens = generate_sampled(e, prompt, &opts, |s| scores.extend(s.logprobs.clone()))
            .expect("generate");
        (tokens, scores)
    })
}

#[test]
fn sampling_from_device_candidates_equals_sampling_whole_rows() {
    // Untied and with spread logits: draws differ from step to step.
    let path = model("tiny-qwen2");
    let mut gpu = engine(&path, 1, true);
    let vocab = gpu.model_config().vocab_size;
    let prompt = prompts(vocab).swap_remove(1);
    for (temperature, top_p, seed) in [(0.8, 1.0, 3), (1.5, 0.9, 11)] {
        let sampling = SamplingParams {
            temperature,
            top_p,
            seed: Some(seed),
            ..SamplingParams::greedy()
        };
        let [(from_candidates, _), (from_rows, _)] =
            reduced_and_whole(&mut gpu, &prompt, sampling, 16);
        assert_eq!(
            from_candidates, from_rows,
            "temperature {temperature}, top_p {top_p}, seed {seed}"
        );
        // Not all one token: the draws are really random.
        let distinct: std::collections::BTreeSet<_> = from_candidates.iter().collect();
        assert!(distinct.len() > 2, "{from_candidates:?}");
    }
}

/// Rows that report log-probabilities are reduced on the device to their arg-max,
/// candidates and log-sum-exp: greedy and sampled, they give the tokens and the
/// log-probabilities (the chosen token's and the most likely ones) of whole rows.
#[test]
fn log_probabilities_from_device_reductions_equal_whole_rows() {
    let path = model("tiny-qwen2");
    let mut gpu = engine(&path, 1, true);
    let vocab = gpu.model_config().vocab_size;
    let prompt = prompts(vocab).swap_remove(1);
    let mut bits_differ = false;
    for (temperature, top, seed) in [(0.0, 5, 1), (0.9, 3, 7), (1.4, 0, 13)] {
        let sampling = SamplingParams {
            temperature,
            seed: Some(seed),
            logprobs: Some(top),
            ..SamplingParams::greedy()
        };
        let [(tokens, reduced), (want_tokens, whole)] =
            reduced_and_whole(&mut gpu, &prompt, sampling, 12);
        assert_eq!(
            reduced.len(),
            tokens.len(),
            "log-probabilities for every token"
        );
        let what = format!("temperature {temperature}, top {top}");
        assert_eq!(tokens, want_tokens, "{what}");
        for (i, (g, w)) in reduced.iter().zip(&whole).enumerate() {
            assert!(
                (g.logprob - w.logprob).abs() < 1e-4,
                "{what} token {i}: {g:?} {w:?}"
            );
            assert_eq!(g.top.len(), w.top.len(), "{what} token {i}");
            assert_eq!(g.top.len(), top, "{what} token {i}");
            for (a, b) in g.top.iter().zip(&w.top) {
                assert_eq!(a.0, b.0, "{what} token {i}");
                assert!((a.1 - b.1).abs() < 1e-4, "{what} token {i}: {a:?} {b:?}");
            }
            bits_differ |= g.logprob != w.logprob;
        }
    }
    // Not the host's own numbers: the device's log-sum-exp (summed in another order)
    // really gave them.
    assert!(bits_differ, "every log-probability equal to the last bit");
}

#[test]
fn an_unsupported_head_dim_is_refused_at_load() {
    // The tiny fixture's head dimension is 16, which no CUDA attention kernel serves.
    let path = common::fixtures().join("tiny-mistral");
    let mut cfg = EngineConfig::new(&path);
    cfg.emulate_gpu = true;
    let err = Engine::load(&cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("head dimension 16"), "{err}");
}
