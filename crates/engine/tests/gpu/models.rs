//! Whole models on the GPU: random-weight Llama- and Qwen2-shaped models made by
//! `scripts/gpu/make_models.py` (bf16 safetensors with transformers' float32 logits),
//! the same weights as GGUF Q4_1 and Q8_0 (written here), and a gpt-oss-shaped model
//! with MXFP4 experts (served as Q5_0; candle's quantized CUDA matmuls, so held to the
//! GGUF bound).
//!
//! Bounds: CUDA computes matmul inputs in bf16 (f32 accumulation, f32 residual stream and
//! logits) where the CPU engine computes in f32, so logits differ by bf16 rounding: the
//! relative L2 bound is 2e-2 for bf16 weights (3e-2 for Gemma 3; see `common`). On GGUF
//! weights both engines quantize the activations to q8_1, the GPU from bf16-rounded values, so some roundings differ by a
//! step; the bound is 5e-2 (on these models, Q8_0 weights alone move the CPU engine's
//! logits 1.7e-2 from the bf16 weights'). Greedy text is compared token by token until the reference
//! run meets a near tie (top-2 logit gap below the stated margin), where rounding may
//! legitimately pick the other token; at least 8 tokens must be compared.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tessera_engine::{generate, DeviceSpec, Engine, EngineConfig};
use tessera_protocol::Executor;

use crate::common::{
    agree_until_tie, floats, gpu_check_prompts, gpu_logits_bound, greedy_opts, greedy_steps,
    read_json, rel_l2, GPU_GGUF_LOGITS_BOUND, GPU_LOGITS_BOUND, GPU_TP_MARGIN,
};
use crate::gguf_writer::{
    check_gguf, BF16_CHECK_MODELS, GGUF_CHECK_FORMATS, GGUF_CHECK_MODELS, MXFP4_CHECK_MODELS,
};
use crate::report::check;

mod embeddings;
mod fit;
mod graphs;
mod mtp;
mod nccl_tp;

const MIN_COMPARED: usize = 8;

fn models_dir() -> PathBuf {
    let dir = std::env::var("TESSERA_GPU_MODELS")
        .expect("TESSERA_GPU_MODELS: the folder scripts/gpu/make_models.py wrote");
    PathBuf::from(dir)
}

/// Whether to check model `name`: `TESSERA_GPU_ONLY` (comma-separated names, as
/// `scripts/test-gpu` passes it) narrows the checks to those models, and
/// `TESSERA_GPU_SHARD=K/N` (its parallel parts) keeps every Nth model from the Kth, so that
/// no two parts write the same GGUF files.
fn selected(name: &str) -> bool {
    let only = std::env::var("TESSERA_GPU_ONLY").unwrap_or_default();
    let listed = only.is_empty() || only.split(',').any(|o| o.trim() == name);
    listed && in_shard(name)
}

fn in_shard(name: &str) -> bool {
    let Ok(spec) = std::env::var("TESSERA_GPU_SHARD") else {
        return true;
    };
    let (k, n) = spec
        .split_once('/')
        .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
        .filter(|&(k, n)| k < n)
        .unwrap_or_else(|| panic!("TESSERA_GPU_SHARD={spec}: expected K/N with K < N"));
    let mut all = GGUF_CHECK_MODELS
        .iter()
        .chain(BF16_CHECK_MODELS.iter())
        .chain(MXFP4_CHECK_MODELS.iter());
    all.position(|m| *m == name)
        .is_some_and(|index| index % n == k)
}

/// The models under test: (label, path, folder with the transformers reference).
fn models() -> &'static Vec<Model> {
    static MODELS: OnceLock<Vec<Model>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let dir = models_dir();
        let mut out = Vec::new();
        for name in GGUF_CHECK_MODELS.into_iter().filter(|m| selected(m)) {
            let folder = dir.join(name);
            out.push((format!("{name} bf16"), folder.clone(), folder.clone()));
            for (q, tag) in GGUF_CHECK_FORMATS {
                let file = check_gguf(&folder, q, tag);
                out.push((format!("{name} {tag} GGUF"), file, folder.clone()));
            }
        }
        for name in BF16_CHECK_MODELS.into_iter().filter(|m| selected(m)) {
            let folder = dir.join(name);
            // make_models.py makes a model only where the host's transformers has its class
            // (MiniMax-M2 needs transformers 5); the report says which were not made.
            if !folder.join("config.json").exists() {
                println!(
                    "GPU-CHECK | {name} bf16 | not made on this host (make_models.py's log \
                     says why) | skipped"
                );
                continue;
            }
            out.push((format!("{name} bf16"), folder.clone(), folder));
        }
        for name in MXFP4_CHECK_MODELS.into_iter().filter(|m| selected(m)) {
            let folder = dir.join(name);
            out.push((format!("{name} MXFP4"), folder.clone(), folder));
        }
        out
    })
}

type Model = (String, PathBuf, PathBuf);

/// Runs `body` for each model, going on past one whose checks fail (a failed check
/// panics), then fails naming every model that failed: one device run reports on every
/// model rather than stopping at the first failure.
fn each_model<'a>(models: impl IntoIterator<Item = &'a Model>, body: impl Fn(&'a Model)) {
    let mut failed = Vec::new();
    for model in models {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(model)));
        if run.is_err() {
            failed.push(model.0.clone());
        }
    }
    assert!(
        failed.is_empty(),
        "checks failed for: {}",
        failed.join(", ")
    );
}

fn devices(spec: &str) -> Vec<DeviceSpec> {
    DeviceSpec::parse_list(spec).expect("device list")
}

fn engine(path: &Path, spec: &str) -> Engine {
    try_engine(path, spec).unwrap_or_else(|e| panic!("{} on {spec}: {e}", path.display()))
}

fn try_engine(path: &Path, spec: &str) -> Result<Engine, String> {
    let mut cfg = EngineConfig::new(path);
    cfg.devices = devices(spec);
    cfg.kv_cache_bytes = 128 << 20;
    Engine::load(&cfg).map_err(|e| e.to_string())
}

#[test]
fn cuda_logits_match_cpu_and_transformers() {
    each_model(models(), |(label, path, ref_dir)| {
        let mut cpu = engine(path, "cpu:0");
        let mut gpu = engine(path, "cuda:0");
        let vocab = cpu.model_config().vocab_size;
        let reference = read_json(ref_dir.join("reference.json"));
        let cases = reference["cases"].as_array().expect("cases").clone();
        let (mut worst_cpu, mut worst_hf) = (0f32, 0f32);
        for (i, prompt) in gpu_check_prompts(ref_dir, vocab).iter().enumerate() {
            let on_cpu = crate::common::last_logits(&mut cpu, prompt);
            let on_gpu = crate::common::last_logits(&mut gpu, prompt);
            worst_cpu = worst_cpu.max(rel_l2(&on_gpu, &on_cpu));
            if !label.contains("GGUF") {
                if let Some(case) = cases.get(i) {
                    worst_hf = worst_hf.max(rel_l2(&on_gpu, &floats(&case["last_logits"])));
                }
            }
        }
        let bound = if label.contains("GGUF") || label.contains("MXFP4") {
            GPU_GGUF_LOGITS_BOUND
        } else {
            gpu_logits_bound(label)
        };
        check(
            &format!("{label}: CUDA logits against the CPU engine (4 prompts, up to 700 tokens)"),
            format!("rel L2 {worst_cpu:.2e}"),
            format!("< {bound:.0e}"),
            worst_cpu < bound,
        );
        if !label.contains("GGUF") {
            check(
                &format!("{label}: CUDA logits against transformers (float32)"),
                format!("rel L2 {worst_hf:.2e}"),
                format!("< {bound:.0e}"),
                worst_hf < bound,
            );
        }
    });
}

#[test]
fn greedy_text_on_cuda_equals_the_cpu_engine() {
    // bf16 moves these logits by about 0.02: a gap of 0.1 is safely decided.
    let margin = 0.1;
    let dense = models().iter().filter(|m| m.0.contains("bf16"));
    each_model(dense, |(label, path, ref_dir)| {
        let mut cpu = engine(path, "cpu:0");
        let mut gpu = engine(path, "cuda:0");
        let vocab = cpu.model_config().vocab_size;
        let mixture = cpu.model_config().moe.is_some();
        let mut compared_tokens = 0;
        for prompt in gpu_check_prompts(ref_dir, vocab) {
            let want = greedy_steps(&mut cpu, &prompt, 24, 7);
            let got = greedy_steps(&mut gpu, &prompt, 24, 7);
            // The serving path: the GPU reduces greedy rows to their arg-max itself.
            let served =
                generate(&mut gpu, &prompt, &greedy_opts(24, 7), |_| {}).expect("generate");
            check(
                &format!("{label}: arg-max on the GPU = arg-max of the copied logits, prompt of {} tokens", prompt.len()),
                format!("identical: {}", served == got.0),
                "identical".into(),
                served == got.0,
            );
            let agreement = GreedyAgreement::of(&[want], &[got], margin, mixture);
            compared_tokens += agreement.compared;
            check(
                &format!(
                    "{label}: greedy CUDA = CPU, prompt of {} tokens",
                    prompt.len()
                ),
                format!("{agreement}"),
                near_tie_bound(margin, mixture),
                agreement.same,
            );
        }
        check(
            &format!("{label}: greedy tokens compared over the 4 prompts"),
            format!("{compared_tokens}"),
            format!(">= {}", 2 * MIN_COMPARED),
            compared_tokens >= 2 * MIN_COMPARED,
        );
    });
}

/// TP = 1 on the GPU as the reference of a tensor-parallel run: its logits of the second
/// check prompt, its greedy runs of all four, and the CPU engine's logits of that prompt.
struct Tp1 {
    prompts: Vec<Vec<u32>>,
    mixture: bool,
    logits: Vec<f32>,
    greedy: Vec<(Vec<u32>, Vec<f32>)>,
    cpu_logits: Vec<f32>,
}

impl Tp1 {
    fn of(path: &Path, ref_dir: &Path) -> Self {
        let mut tp1 = engine(path, "cuda:0");
        let vocab = tp1.model_config().vocab_size;
        let mixture = tp1.model_config().moe.is_some();
        let prompts = gpu_check_prompts(ref_dir, vocab);
        let logits = crate::common::last_logits(&mut tp1, &prompts[1]);
        let greedy = prompts
            .iter()
            .map(|p| greedy_steps(&mut tp1, p, 24, 5))
            .collect();
        drop(tp1);
        let cpu_logits = crate::common::last_logits(&mut engine(path, "cpu:0"), &prompts[1]);
        Tp1 {
            prompts,
            mixture,
            logits,
            greedy,
            cpu_logits,
        }
    }

    /// Checks `e` (a tensor-parallel run, `what` in the report) against TP = 1: a dense
    /// model's logits within 1e-2 and its greedy text over the four prompts; quantized
    /// weights' logits as close to the CPU engine as TP = 1's, give or take half of that
    /// (q8_1 activation roundings flip with the f32 summation order). `beside`: the
    /// distance to another run of the same ranks, held to 1e-2 too.
    fn check(&self, label: &str, what: &str, e: &mut Engine, beside: Option<(&str, &[f32])>) {
        let logits = crate::common::last_logits(e, &self.prompts[1]);
        let diff = rel_l2(&logits, &self.logits);
        let (beside_figure, beside_ok) = match beside {
            Some((name, other)) => {
                let d = rel_l2(&logits, other);
                (format!(" (against {name} {d:.2e})"), d < 1e-2)
            }
            None => (String::new(), true),
        };
        if label.contains("bf16") {
            let runs: Vec<_> = self
                .prompts
                .iter()
                .map(|p| greedy_steps(e, p, 24, 5))
                .collect();
            let agreement = GreedyAgreement::of(&self.greedy, &runs, GPU_TP_MARGIN, self.mixture);
            check(
                &format!("{label}: {what} against TP=1"),
                format!("logits rel L2 {diff:.2e}{beside_figure}; {agreement}"),
                format!(
                    "< 1e-2; {}, >= {} compared",
                    near_tie_bound(GPU_TP_MARGIN, self.mixture),
                    2 * MIN_COMPARED
                ),
                diff < 1e-2
                    && beside_ok
                    && agreement.same
                    && agreement.compared >= 2 * MIN_COMPARED,
            );
        } else {
            let base_err = rel_l2(&self.logits, &self.cpu_logits);
            let err = rel_l2(&logits, &self.cpu_logits);
            let bound = 1.5 * base_err;
            check(
                &format!("{label}: {what}, distance to the CPU engine"),
                format!("rel L2 {err:.2e} (TP=1: {base_err:.2e}){beside_figure}"),
                format!("<= 1.5 x TP=1 = {bound:.2e}"),
                err <= bound && beside_ok,
            );
        }
    }
}

#[test]
fn tensor_parallel_on_one_gpu_equals_tp1() {
    let checked = models().iter().filter(|m| !m.0.contains("q8_0"));
    each_model(checked, |(label, path, ref_dir)| {
        let tp1 = Tp1::of(path, ref_dir);
        for tp in 2..=4 {
            let spec = vec!["cuda:0"; tp].join(",");
            let mut e = match try_engine(path, &spec) {
                Ok(e) => e,
                // A k-quant's 256-weight super-blocks split a small model's heads over
                // fewer ranks: the plan refuses more, naming how many it takes.
                Err(why) if label.contains("q4_k_m") && why.contains("splits over at most") => {
                    check(
                        &format!("{label}: TP={tp} on one GPU"),
                        format!("refused at load: {why}"),
                        "refused where the super-blocks do not split".into(),
                        true,
                    );
                    continue;
                }
                Err(why) => panic!("{} on {spec}: {why}", path.display()),
            };
            tp1.check(label, &format!("TP={tp} on one GPU"), &mut e, None);
        }
    });
}

/// A mixture's choice of experts can flip where two experts' router scores are close, and
/// bf16 rounding (or TP's summation order) decides such a tie; the flip moves the logits
/// by more than rounding moves them elsewhere. On an H100 a MiniMax-M2-shaped model's TP = 2
/// run parted from TP = 1 where TP = 1's top-2 gap was 0.149 and TP = 2's, the other way,
/// 0.034. A mixture's run may part from its reference where both runs' top-2 gaps are
/// under this bound (then the comparison of that prompt ends there); a dense model's may
/// not.
const MIXTURE_TIE: f32 = 0.5;

/// The bound of a greedy comparison, as the report states it.
fn near_tie_bound(margin: f32, mixture: bool) -> String {
    if mixture {
        format!(
            "identical (near tie: top-2 gap < {margin}; a mixture's run may part where both \
             runs' gaps are < {MIXTURE_TIE})"
        )
    } else {
        format!("identical (near tie: top-2 gap < {margin})")
    }
}

/// Greedy runs of several prompts against the reference runs of the same prompts, each
/// compared up to the reference's first near tie; where one parts from its reference
/// before that, where and across which top-2 gaps (the figure a failure needs).
struct GreedyAgreement {
    prompts: usize,
    compared: usize,
    same: bool,
    /// The first parting: (prompt, token, the reference's top-2 gap there, the other
    /// run's, whether it was a mixture's near tie).
    parted: Option<(usize, usize, f32, f32, bool)>,
}

impl GreedyAgreement {
    fn of(
        reference: &[(Vec<u32>, Vec<f32>)],
        runs: &[(Vec<u32>, Vec<f32>)],
        margin: f32,
        mixture: bool,
    ) -> Self {
        let mut out = GreedyAgreement {
            prompts: reference.len(),
            compared: 0,
            same: true,
            parted: None,
        };
        for (p, (want, got)) in reference.iter().zip(runs).enumerate() {
            let (compared, same) = agree_until_tie(want, &got.0, margin);
            if same {
                out.compared += compared;
                continue;
            }
            let at = (0..compared)
                .find(|&i| want.0[i] != got.0[i])
                .unwrap_or(compared);
            let gap = |run: &(Vec<u32>, Vec<f32>)| run.1.get(at).copied().unwrap_or(f32::NAN);
            let (want_gap, got_gap) = (gap(want), gap(got));
            let tie = mixture && want_gap < MIXTURE_TIE && got_gap < MIXTURE_TIE;
            out.compared += at;
            out.same &= tie;
            if out.parted.is_none() || !tie {
                out.parted = Some((p, at, want_gap, got_gap, tie));
            }
        }
        out
    }
}

impl std::fmt::Display for GreedyAgreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "greedy {} tokens compared over {} prompt(s), identical: {}",
            self.compared, self.prompts, self.same
        )?;
        if let Some((p, at, want, got, tie)) = self.parted {
            let kind = if tie { " at a mixture's near tie" } else { "" };
            write!(
                f,
                " (prompt {p} parted at token {at}{kind}: top-2 gap {want:.3} in the reference \
                 run, {got:.3} in this one)"
            )?;
        }
        Ok(())
    }
}

#[test]
fn the_kv_cache_fills_the_gpu_up_to_the_utilization() {
    let Some((_, path, _)) = models().first() else {
        println!("skipped: TESSERA_GPU_ONLY selects no model");
        return;
    };
    for (spec, utilization) in [("cuda:0", 0.5), ("cuda:0,cuda:0", 0.3)] {
        let mut cfg = EngineConfig::new(path);
        cfg.devices = devices(spec);
        cfg.gpu_memory_utilization = Some(utilization);
        let mut e = Engine::load(&cfg).expect("load");
        let (free, total) = gpu_memory();
        let used = (total - free) as f64 / total as f64;
        let tokens = e.kv_cache_shape().capacity_tokens();
        // The cache serves a step after the resize.
        let logits = crate::common::last_logits(&mut e, &[1, 2, 3, 4, 5]);
        check(
            &format!("--gpu-memory-utilization {utilization} on {spec}"),
            format!(
                "{:.1}% of the GPU in use, KV cache of {tokens} tokens",
                used * 100.0
            ),
            format!(
                "<= {:.0}% + 2%, a cache of over 100k tokens, a step runs",
                utilization * 100.0
            ),
            used <= utilization + 0.02 && tokens > 100_000 && logits.iter().all(|x| x.is_finite()),
        );
    }
}

fn gpu_memory() -> (usize, usize) {
    let device = crate::report::gpu();
    let candle_core::Device::Cuda(d) = &device else {
        panic!("not a CUDA device")
    };
    d.cuda_stream()
        .context()
        .mem_get_info()
        .expect("memory info")
}

#[test]
fn an_unsupported_head_dim_is_refused_at_load() {
    let path = models_dir().join("llama-hd32");
    if !path.exists() {
        println!("skipped: llama-hd32 was not made (TESSERA_GPU_ONLY)");
        return;
    }
    let mut cfg = EngineConfig::new(&path);
    cfg.devices = devices("cuda:0");
    let err = Engine::load(&cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check(
        "head dim 32 on CUDA refused at load",
        format!("error: {err}"),
        "names the head dimension".into(),
        err.contains("head dimension 32"),
    );
}

#[test]
fn a_layer_map_puts_layers_on_the_gpu_and_the_rest_on_the_host() {
    let Some((_, path, ref_dir)) = models().first() else {
        println!("skipped: TESSERA_GPU_ONLY selects no model");
        return;
    };
    let mut cfg = EngineConfig::new(path);
    cfg.devices = devices("cuda:0");
    cfg.device_layers = Some("0:2".parse().expect("layer map"));
    cfg.kv_cache_bytes = 64 << 20;
    let mut mixed = Engine::load(&cfg).expect("layers 0-1 on cuda:0, 2-3 on the host");
    let mut cpu = engine(path, "cpu:0");
    let vocab = cpu.model_config().vocab_size;
    let mut worst = 0f32;
    for prompt in gpu_check_prompts(ref_dir, vocab) {
        let want = crate::common::last_logits(&mut cpu, &prompt);
        let got = crate::common::last_logits(&mut mixed, &prompt);
        worst = worst.max(rel_l2(&got, &want));
    }
    check(
        "llama bf16: --device-layers 0:2 (2 layers on cuda:0, 2 on the host) against the CPU engine",
        format!("rel L2 {worst:.2e}"),
        format!("< {GPU_LOGITS_BOUND:.0e}"),
        worst < GPU_LOGITS_BOUND,
    );
}
