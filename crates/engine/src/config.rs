//! How an engine runs ([`EngineConfig`]): the model file, the devices and their split,
//! the KV cache budget, timeouts, and this process's place in a group of nodes
//! ([`NodeTopology`]). What the model itself is lives in `crate::spec`.

use std::path::PathBuf;
use std::time::Duration;

use crate::device::device_spec::DeviceSpec;
use crate::device::dtype::KvCacheDtypeChoice;
use crate::device::host_memory::CpuKvSizing;
use crate::device::layer_map::DeviceLayers;
use crate::device::memory_caps::DeviceMemory;
use crate::tp::AllReduceDtype;

// What a model is, under the paths other crates name it by.
pub use crate::spec::moe::ClampedSwiglu;
pub use crate::spec::rope::RopeScaling;

/// How to build an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    /// One entry per rank (`cpu:0,cpu:1`); its length is the tensor-parallel size.
    pub devices: Vec<DeviceSpec>,
    /// Relative share of each rank; equal when `None`.
    pub tensor_split: Option<Vec<f64>>,
    pub allreduce_dtype: AllReduceDtype,
    /// How ranks sharing one GPU are joined: the same-GPU communicator, or NCCL.
    pub same_gpu_comm: crate::tp::SameGpuComm,
    pub block_size_tokens: usize,
    /// KV cache budget per rank; the number of blocks follows from it. CUDA ranks size
    /// their cache from `gpu_memory_utilization` instead when that is set, CPU ranks
    /// from `cpu_kv_sizing`.
    pub kv_cache_bytes: usize,
    /// What the KV cache stores (`--kv-cache-dtype`). `None`: the type each rank computes
    /// in (f32 on CPU ranks, bf16 on GPUs), what the engine's reference tests run.
    pub kv_cache_dtype: Option<KvCacheDtypeChoice>,
    /// CPU ranks' cache from the memory available after the weights (one node only: the
    /// nodes of a group agree on `kv_cache_bytes` instead). `None`: `kv_cache_bytes`.
    pub cpu_kv_sizing: Option<CpuKvSizing>,
    /// Fraction of each GPU's memory the engine may use: the KV cache gets what the
    /// weights and a profile step at the largest batch leave under it.
    pub gpu_memory_utilization: Option<f64>,
    /// The largest step the scheduler will send (tokens, sequences), for the profile
    /// step that measures activation memory on GPUs.
    pub max_batch_tokens: usize,
    pub max_num_seqs: usize,
    /// Pipeline placement of whole layers (`--device-layers "0:16;1:14"`, or `auto` to
    /// fit them to each device's memory) instead of tensor parallelism over `devices`.
    pub device_layers: Option<DeviceLayers>,
    /// The most the automatic layer map may use on each device and on the host
    /// (`--device-memory-mib`); with caps that tensor parallelism cannot fit, the map is
    /// fitted even when none is asked for.
    pub device_memory: DeviceMemory,
    /// The routed experts of layers `0..n` stay on the host, run by the CPU kernels, the
    /// rest of those layers on their device (`--n-cpu-moe`; `--cpu-moe`: every layer).
    /// `None`: none, or as many as the automatic layer map needs.
    pub host_expert_layers: Option<usize>,
    /// Worker threads per rank; by default the machine's cores divided among the ranks.
    pub threads_per_rank: Option<usize>,
    /// A collective waiting longer than this for other ranks fails; a step taking longer
    /// fails the engine.
    pub step_timeout: Duration,
    /// This process's place in a group of nodes; `None`: every rank is in this process.
    /// With N nodes, `devices` are this node's ranks, a 1/N of the group.
    pub nodes: Option<NodeTopology>,
    /// Test builds: CPU ranks take the CUDA ranks' forward pass, with our CUDA kernels
    /// emulated on the host (one node; in a layer map, the stages that are not the
    /// host's).
    #[cfg(feature = "gpu-emulation")]
    pub emulate_gpu: bool,
    /// The longest sequence (prompt and completion) the engine serves, below the model's
    /// own context (`--max-model-len`); `None`: the model's. It also sizes the RoPE tables
    /// and chooses LongRoPE's factors.
    pub max_model_len: Option<usize>,
    /// Layers with a sliding window keep only their window's KV, in block tables of their
    /// own (vLLM's hybrid KV cache manager), when the model mixes them with
    /// full-attention layers; `false`: one table for all layers
    /// (`--disable-hybrid-kv-cache-manager`).
    pub hybrid_kv_cache: bool,
    /// Load the model's multi-token-prediction layer, and guess with it where a step asks
    /// for guesses (`--speculative-config` method `mtp`); tensor parallelism on one node
    /// only.
    pub mtp: bool,
    /// CUDA ranks replay decode steps from CUDA graphs recorded at load, one per
    /// batch-size bucket up to `max_num_seqs` and context bound (`false`:
    /// `--enforce-eager`). Models a graph cannot record (mixtures of experts, pipeline
    /// stages, hybrid KV groups, the MTP layer, collectives that synchronize with the
    /// host) run eagerly, and the log says why.
    pub decode_graphs: bool,
}

impl EngineConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        Self {
            model_path: model_path.into(),
            devices: vec![DeviceSpec::Cpu(0)],
            tensor_split: None,
            allreduce_dtype: AllReduceDtype::F32,
            same_gpu_comm: crate::tp::SameGpuComm::Device,
            block_size_tokens: 16,
            kv_cache_bytes: 256 << 20,
            cpu_kv_sizing: None,
            kv_cache_dtype: None,
            gpu_memory_utilization: None,
            max_batch_tokens: 2048,
            max_num_seqs: 64,
            device_layers: None,
            device_memory: DeviceMemory::default(),
            host_expert_layers: None,
            threads_per_rank: None,
            step_timeout: Duration::from_secs(120),
            nodes: None,
            #[cfg(feature = "gpu-emulation")]
            emulate_gpu: false,
            max_model_len: None,
            hybrid_kv_cache: true,
            mtp: false,
            decode_graphs: false,
        }
    }

    /// Whether CPU ranks take the CUDA ranks' forward pass (test builds with
    /// `emulate_gpu`; never otherwise).
    pub fn emulates_gpu(&self) -> bool {
        #[cfg(feature = "gpu-emulation")]
        return self.emulate_gpu;
        #[cfg(not(feature = "gpu-emulation"))]
        false
    }

    /// CPU ranks `cpu:0 .. cpu:n-1`.
    pub fn with_cpu_ranks(mut self, n: usize) -> Self {
        self.devices = (0..n).map(DeviceSpec::Cpu).collect();
        self
    }
}

/// Where this process sits in a group of nodes (`--nnodes`, `--node-rank`,
/// `--master-addr`, `--master-port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTopology {
    pub nnodes: usize,
    pub node_rank: usize,
    /// The leader's host name or address, as the workers reach it.
    pub master_addr: String,
    /// The leader's rendezvous port.
    pub master_port: u16,
    /// How long the leader waits for every worker to join, and a worker for the leader.
    pub join_timeout: Duration,
}

impl NodeTopology {
    pub fn is_leader(&self) -> bool {
        self.node_rank == 0
    }
}
