//! Command-line options that choose the model and how it is spread over devices.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_engine::device::dtype::KvCacheDtypeChoice;
use tessera_engine::device::host_memory::CpuKvSizing;
use tessera_engine::tp::AllReduceDtype;
use tessera_engine::{load_tokenizer, DeviceSpec, EngineConfig, Tokenizer};
use tessera_tokenizer::sandbox::SandboxLauncher;

use crate::help_headings::{DEVICES, MODEL};
use crate::hub::{self, HubSettings, ModelRef};

/// `--kv-cache-memory-mib` of CPU ranks in a group of nodes when none is given (one
/// node sizes its CPU ranks' cache from the memory left after the weights).
pub const DEFAULT_CPU_KV_CACHE_MIB: usize = 256;

/// `--cpu-kv-cache-utilization`: half the memory available after the weights, so the
/// machine keeps as much for everything else even once the cache is full.
pub const DEFAULT_CPU_KV_CACHE_UTILIZATION: f64 = 0.5;

#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A .gguf file, a Hugging Face folder (config.json + safetensors), or a Hugging Face
    /// repository: org/repo (safetensors), org/repo:Q4_K_M or org/repo:FILE.gguf (GGUF),
    /// downloaded into the Hugging Face cache (HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE).
    /// Default: the SmolLM2 model fetched by scripts/fetch-model.
    #[arg(long, env = "TESSERA_MODEL", value_name = "PATH|ORG/REPO[:TAG]", help_heading = MODEL)]
    pub model: Option<String>,

    /// Branch, tag or commit of the --model repository (default: main).
    #[arg(long, help_heading = MODEL)]
    pub revision: Option<String>,

    /// The local path `model` resolved to (a download happens once per process).
    #[arg(skip)]
    resolved: Arc<Mutex<Option<PathBuf>>>,

    /// Logs are JSON lines: a download reports progress as log lines, never as a bar,
    /// even on a terminal.
    #[arg(skip)]
    pub json_logs: bool,

    /// Where the tokenizer and chat template come from, when not from the model itself: a
    /// folder with tokenizer.json (and tokenizer_config.json), or a GGUF file.
    #[arg(long, env = "TESSERA_TOKENIZER", help_heading = MODEL)]
    pub tokenizer: Option<PathBuf>,

    /// A Jinja chat template file that replaces the model's own (for a model file that
    /// has none, or to change it), as in tokenizer_config.json's `chat_template`.
    #[arg(long, env = "TESSERA_CHAT_TEMPLATE", help_heading = MODEL)]
    pub chat_template: Option<PathBuf>,

    /// Memory, in MiB, that one chat-template render may use (at least 16). Templates
    /// render in sandbox processes; a render that needs more fails its request with a 400.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(16..), help_heading = MODEL)]
    pub chat_template_memory_mib: u64,

    /// Seconds one chat-template render may take before it is stopped (a 400; at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..), help_heading = MODEL)]
    pub chat_template_timeout: u64,

    /// Where chat templates render: in sandbox processes when set (the `tessera` binary
    /// sets it), else in this process.
    #[arg(skip)]
    pub template_sandbox: Option<SandboxLauncher>,

    /// Number of devices (ranks) the model is split over.
    #[arg(long, default_value_t = 1, help_heading = DEVICES)]
    pub tensor_parallel_size: usize,

    /// Devices, one per rank, e.g. cpu:0,cpu:1 (default: cpu:0..cpu:N-1).
    #[arg(long, help_heading = DEVICES)]
    pub devices: Option<String>,

    /// Relative share of each device, e.g. 3,1 (default: equal).
    #[arg(long, value_delimiter = ',', help_heading = DEVICES)]
    pub tensor_split: Option<Vec<f64>>,

    /// Pipeline placement of whole layers, e.g. "0:16;1:14" (ordinal:layers of the
    /// --devices; layers left over run on the host CPU), "0,1:16;2,3:14" (each stage a
    /// tensor-parallel group), or "auto" to fit the layers to each device's free memory
    /// (also chosen when the weights do not fit the devices by tensor parallelism).
    #[arg(long, help_heading = DEVICES)]
    pub device_layers: Option<String>,

    /// The most the automatic layer map may use per device, in MiB, e.g.
    /// "cuda:0=20000,cuda:1=20000" (and "host=MIB" for the host). Required for CPU ranks
    /// under --device-layers auto.
    #[arg(long, help_heading = DEVICES)]
    pub device_memory_mib: Option<String>,

    /// Keep every mixture-of-experts layer's routed experts on the host, run by the CPU
    /// kernels, with attention, dense layers and the router on the GPU.
    #[arg(long, help_heading = DEVICES)]
    pub cpu_moe: bool,

    /// Keep the routed experts of the first N layers on the host (--cpu-moe for some).
    /// Unset with --device-layers auto: as few as let every layer fit the devices.
    #[arg(long, help_heading = DEVICES)]
    pub n_cpu_moe: Option<usize>,

    /// Precision of the all-reduce between ranks: f32 or bf16.
    #[arg(long, default_value = "f32", help_heading = DEVICES)]
    pub allreduce_dtype: AllReduceDtype,

    /// How ranks that share one GPU (--devices cuda:0,cuda:0) are joined: device (the
    /// same-GPU communicator) or nccl (NCCL 2.30 or newer, with
    /// NCCL_MULTI_RANK_GPU_ENABLE=1; refused at start-up otherwise, naming both).
    #[arg(long, default_value = "device", help_heading = DEVICES)]
    pub same_gpu_comm: tessera_engine::tp::SameGpuComm,

    /// KV cache budget per rank, in MiB (default: on CPU ranks, what
    /// --cpu-kv-cache-utilization gives, 256 in a group of nodes; on GPUs, what
    /// --gpu-memory-utilization leaves).
    #[arg(long, help_heading = DEVICES)]
    pub kv_cache_memory_mib: Option<usize>,

    /// What the KV cache stores: auto (bf16 on GPUs, f32 on CPU ranks: no 8-bit type keeps
    /// greedy text equal on most prompts, see docs/fidelity.md), bf16, fp16, fp8 (fp8_e4m3: a
    /// scale per layer and KV head, set by a warm-up step at load), int8 (a scale per
    /// block and KV head), or f32 (CPU ranks only). A type a device cannot hold is refused.
    #[arg(long, default_value = "auto", help_heading = DEVICES)]
    pub kv_cache_dtype: KvCacheDtypeChoice,

    /// Keep one KV block table for all layers. By default a model that mixes
    /// sliding-window and full-attention layers (Gemma 2 and 3, gpt-oss, OLMo 3) groups
    /// them by kind, each group with its own block tables (vLLM's hybrid KV cache
    /// manager), so sliding layers hold only their window and the same memory serves
    /// several times the sequences. An fp8 cache always keeps one table.
    #[arg(long, help_heading = DEVICES)]
    pub disable_hybrid_kv_cache_manager: bool,

    /// Run every step eagerly on CUDA ranks. By default each rank records its decode step
    /// as CUDA graphs at start-up, one per batch size (1, 2, 4, … and --max-num-seqs)
    /// and context bound, and replays them, padding a batch to its graph's size; prefill
    /// runs eagerly. Models a graph cannot hold (mixtures of experts, layer maps, hybrid
    /// KV groups, MTP, ranks joined by the same-GPU communicator or NCCL) run eagerly
    /// anyway, and the log says why.
    #[arg(long, help_heading = DEVICES)]
    pub enforce_eager: bool,

    /// Share of the memory available after the weights that the KV cache of CPU ranks
    /// takes, less 1 GiB and the chat-template sandboxes' limits, which always stay free,
    /// and at most what --max-num-seqs sequences of the longest context use. Its pages
    /// become resident only as sequences write into them. Not used when
    /// --kv-cache-memory-mib is given, or by a group of nodes (which agree on
    /// --kv-cache-memory-mib, 256 MiB by default).
    #[arg(long, default_value_t = DEFAULT_CPU_KV_CACHE_UTILIZATION, help_heading = DEVICES)]
    pub cpu_kv_cache_utilization: f64,

    /// Fraction of each GPU's memory Tessera may use: the KV cache gets what the weights
    /// and a profile step at the largest batch leave under it. Not used when
    /// --kv-cache-memory-mib is given, or on CPU ranks.
    #[arg(long, default_value_t = 0.90, help_heading = DEVICES)]
    pub gpu_memory_utilization: f64,

    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16, help_heading = DEVICES)]
    pub block_size: usize,

    /// Worker threads per rank (default: the cores divided among the ranks).
    #[arg(long, help_heading = DEVICES)]
    pub threads_per_rank: Option<usize>,

    /// Seconds a step may take before the engine is declared failed.
    #[arg(long, default_value_t = 120, help_heading = DEVICES)]
    pub step_timeout: u64,

    #[command(flatten)]
    pub nodes: crate::node_args::NodeArgs,
}

impl ModelArgs {
    /// The hub repository `--model` names, when it is not a path here.
    pub fn hub_model(&self) -> Option<ModelRef> {
        let given = self.model.as_deref()?;
        if std::path::Path::new(given).exists() {
            return None;
        }
        ModelRef::parse(given, self.revision.as_deref())
    }

    /// The name the model is served as when `--served-model-name` is not given: a hub
    /// model's reference as given (vLLM's rule), else the file's (or folder's) stem.
    pub fn default_served_name(&self) -> Result<String> {
        if let Some(model) = self.hub_model() {
            return Ok(model.to_string());
        }
        let path = self.model_path()?;
        Ok(path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_string()))
    }

    /// The model path: `--model` as a path, or a hub model downloaded into the cache
    /// (once; later calls return the same path), falling back to the cached default
    /// model.
    pub fn model_path(&self) -> Result<PathBuf> {
        if let Some(given) = &self.model {
            let Some(model) = self.hub_model() else {
                if self.revision.is_some() {
                    bail!(
                        "--revision is for a Hugging Face repository (--model org/repo), \
                         not the path {given}"
                    );
                }
                return Ok(PathBuf::from(given));
            };
            let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(path) = resolved.as_ref() {
                return Ok(path.clone());
            }
            let mut settings = HubSettings::from_process_env();
            settings.progress_bar &= !self.json_logs;
            let path = hub::fetch(&model, &settings)
                .with_context(|| format!("getting the model {model}"))?;
            *resolved = Some(path.clone());
            return Ok(path);
        }
        if self.revision.is_some() {
            bail!("--revision is for a Hugging Face repository given with --model org/repo");
        }
        let path = tessera_engine::default_model_path();
        if !path.exists() {
            bail!(
                "no --model given and the default model is not in the cache ({}); \
                 run scripts/fetch-model to download it",
                path.display()
            );
        }
        Ok(path)
    }

    /// The tokenizer's source: `--tokenizer`, else the model.
    pub fn tokenizer_path(&self) -> Result<PathBuf> {
        match &self.tokenizer {
            Some(p) => Ok(p.clone()),
            None => self.model_path(),
        }
    }

    /// The tokenizer (`--tokenizer`, else the model's) with `--chat-template` applied.
    pub fn load_tokenizer(&self) -> Result<Tokenizer> {
        let path = self.tokenizer_path()?;
        let mut tokenizer = load_tokenizer(&path).context("loading the tokenizer")?;
        if let Some(template) = &self.chat_template {
            let source = std::fs::read_to_string(template)
                .with_context(|| format!("reading --chat-template {}", template.display()))?;
            tokenizer = tokenizer
                .with_chat_template(&source)
                .with_context(|| format!("compiling --chat-template {}", template.display()))?;
        }
        if let Some(launcher) = &self.template_sandbox {
            let mut launcher = launcher.clone();
            launcher.memory_limit_bytes = self.chat_template_memory_mib << 20;
            launcher.render_timeout = Duration::from_secs(self.chat_template_timeout);
            let (mib, secs) = (launcher.memory_limit_bytes >> 20, launcher.render_timeout);
            tokenizer
                .isolate_chat_template(launcher)
                .context("starting the chat template sandbox")?;
            tracing::info!(
                "chat templates render in sandbox processes ({mib} MiB and {:.0} s per render)",
                secs.as_secs_f64()
            );
        }
        Ok(tokenizer)
    }

    /// Host memory the CPU ranks' KV cache always leaves free: 1 GiB for the OS and the
    /// server, and each chat-template sandbox's memory limit.
    pub fn host_reserve_bytes(&self) -> usize {
        let sandboxes = self
            .template_sandbox
            .as_ref()
            .map_or(0, |l| l.max_sandboxes.max(1));
        (1 << 30) + sandboxes * ((self.chat_template_memory_mib as usize) << 20)
    }

    /// The devices of this node's ranks: `--devices`, else one CPU rank per rank.
    pub fn devices(&self) -> Result<Vec<DeviceSpec>> {
        if self.tensor_parallel_size == 0 {
            bail!("--tensor-parallel-size must be at least 1");
        }
        // With several nodes, this node's devices run its share of the ranks.
        let ranks_here = self.nodes.local_ranks(self.tensor_parallel_size)?;
        Ok(match &self.devices {
            Some(list) => {
                let d = DeviceSpec::parse_list(list)?;
                if self.tensor_parallel_size != 1 && d.len() != ranks_here {
                    bail!(
                        "--devices lists {} devices but this node runs {ranks_here} ranks \
                         (--tensor-parallel-size {} over --nnodes {}); give one device per rank",
                        d.len(),
                        self.tensor_parallel_size,
                        self.nodes.nnodes
                    );
                }
                d
            }
            None => (0..ranks_here).map(DeviceSpec::Cpu).collect(),
        })
    }

    pub fn engine_config(&self) -> Result<EngineConfig> {
        let devices = self.devices()?;
        let mut cfg = EngineConfig::new(self.model_path().context("choosing the model")?);
        cfg.devices = devices;
        cfg.tensor_split = self.tensor_split.clone();
        cfg.device_layers = self.device_layers.as_deref().map(str::parse).transpose()?;
        if let Some(caps) = &self.device_memory_mib {
            cfg.device_memory = caps.parse()?;
        }
        cfg.host_expert_layers = match (self.cpu_moe, self.n_cpu_moe) {
            (true, Some(_)) => bail!("give --cpu-moe (every layer) or --n-cpu-moe N, not both"),
            (true, None) => Some(usize::MAX),
            (false, n) => n,
        };
        cfg.allreduce_dtype = self.allreduce_dtype;
        cfg.same_gpu_comm = self.same_gpu_comm;
        cfg.kv_cache_bytes = self.kv_cache_memory_mib.unwrap_or(DEFAULT_CPU_KV_CACHE_MIB) << 20;
        cfg.kv_cache_dtype = Some(self.kv_cache_dtype);
        cfg.hybrid_kv_cache = !self.disable_hybrid_kv_cache_manager;
        cfg.decode_graphs = !self.enforce_eager;
        let utilization = self.cpu_kv_cache_utilization;
        if !(utilization > 0.0 && utilization <= 1.0) {
            bail!("--cpu-kv-cache-utilization must be above 0 and at most 1, not {utilization}");
        }
        // A group of nodes agrees on a fixed budget instead.
        let one_node = self.nodes.nnodes <= 1;
        cfg.cpu_kv_sizing = (self.kv_cache_memory_mib.is_none() && one_node).then(|| CpuKvSizing {
            utilization,
            reserve_bytes: self.host_reserve_bytes(),
        });
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            bail!(
                "--gpu-memory-utilization must be above 0 and at most 1, not {}",
                self.gpu_memory_utilization
            );
        }
        cfg.gpu_memory_utilization = self
            .kv_cache_memory_mib
            .is_none()
            .then_some(self.gpu_memory_utilization);
        cfg.block_size_tokens = self.block_size;
        cfg.threads_per_rank = self.threads_per_rank;
        cfg.step_timeout = Duration::from_secs(self.step_timeout.max(1));
        cfg.nodes = self.nodes.topology();
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use tessera_tokenizer::{ChatMessage, ChatRenderRequest};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    fn model_args(template: &std::path::Path) -> ModelArgs {
        let tokenizer = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tokenizer/smollm2-hf"
        );
        let template = template.to_str().expect("utf-8 path");
        Cli::parse_from(["t", "--tokenizer", tokenizer, "--chat-template", template]).model
    }

    fn scratch(name: &str, text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("tessera-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write the template");
        path
    }

    #[test]
    fn a_chat_template_file_replaces_the_models_own() {
        let path = scratch(
            "ok.jinja",
            "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}\
             {% if add_generation_prompt %}[assistant]{% endif %}",
        );
        let tokenizer = model_args(&path).load_tokenizer().expect("load");
        let messages: Vec<ChatMessage> = serde_json::from_value(serde_json::json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"}
        ]))
        .expect("messages");
        let rendered = tokenizer
            .chat_template()
            .expect("template")
            .render(&ChatRenderRequest {
                messages,
                add_generation_prompt: true,
                tools: None,
                kwargs: Default::default(),
            })
            .expect("render");
        assert_eq!(rendered, "[system] Be brief.\n[user] Hi\n[assistant]");
        let _ = std::fs::remove_file(path);
    }

    /// Without --kv-cache-memory-mib, CPU ranks size their cache from free memory at the
    /// default share, keeping 1 GiB and the sandboxes' memory free; a budget given (or a
    /// group of nodes' fixed one) replaces the sizing, and a share outside (0, 1] is refused.
    #[test]
    fn cpu_ranks_size_their_kv_cache_from_free_memory_unless_given_a_budget() {
        let parse = |extra: &[&str]| {
            let args = ["t", "--model", "/nonexistent/model.gguf"];
            Cli::parse_from(args.iter().chain(extra)).model
        };
        let plain = parse(&[]);
        let cfg = plain.engine_config().expect("config");
        assert_eq!(
            cfg.cpu_kv_sizing,
            Some(CpuKvSizing {
                utilization: DEFAULT_CPU_KV_CACHE_UTILIZATION,
                reserve_bytes: plain.host_reserve_bytes(),
            })
        );
        assert!(plain.host_reserve_bytes() >= 1 << 30);
        let cfg = parse(&["--cpu-kv-cache-utilization", "0.25"])
            .engine_config()
            .expect("config");
        assert_eq!(cfg.cpu_kv_sizing.map(|s| s.utilization), Some(0.25));
        let cfg = parse(&["--kv-cache-memory-mib", "64"])
            .engine_config()
            .expect("config");
        assert_eq!((cfg.cpu_kv_sizing, cfg.kv_cache_bytes), (None, 64 << 20));
        let cfg = parse(&["--nnodes", "2", "--tensor-parallel-size", "2"])
            .engine_config()
            .expect("config");
        assert_eq!(
            (cfg.cpu_kv_sizing, cfg.kv_cache_bytes),
            (None, DEFAULT_CPU_KV_CACHE_MIB << 20)
        );
        let err = parse(&["--cpu-kv-cache-utilization", "1.5"])
            .engine_config()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--cpu-kv-cache-utilization"), "{err}");
    }

    #[test]
    fn sandbox_limits_below_their_floor_are_refused_not_raised() {
        for (flag, value, floor) in [
            ("--chat-template-memory-mib", "8", "16"),
            ("--chat-template-timeout", "0", "1"),
        ] {
            let err = Cli::try_parse_from(["t", flag, value])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(flag) && err.contains(floor),
                "{flag} {value}: {err}"
            );
        }
        let ok = Cli::parse_from(["t", "--chat-template-memory-mib", "16"]).model;
        assert_eq!(ok.chat_template_memory_mib, 16);
    }

    #[test]
    fn a_chat_template_that_does_not_compile_is_refused_by_name() {
        let path = scratch("bad.jinja", "{% for m in messages %}");
        let err = format!(
            "{:#}",
            model_args(&path).load_tokenizer().expect_err("refused")
        );
        assert!(err.contains("compiling --chat-template"), "{err}");
        let missing = model_args(std::path::Path::new("/no/such/template.jinja"));
        let err = format!("{:#}", missing.load_tokenizer().expect_err("refused"));
        assert!(
            err.contains("reading --chat-template /no/such/template.jinja"),
            "{err}"
        );
        let _ = std::fs::remove_file(path);
    }
}
