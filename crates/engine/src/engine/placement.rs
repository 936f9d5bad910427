//! How a loaded model is laid out on devices: tensor-parallel ranks (every rank holds a
//! slice of every layer) or pipeline stages from a layer map (every stage holds whole
//! layers). Either way the result is a list of members, each becoming one worker.

use std::ops::Range;
use std::time::Duration;

use crate::cluster::links::NodeLinks;
use crate::config::EngineConfig;
use crate::device::device_spec::DeviceSpec;
use crate::device::layer_map::{LayerMap, Stage};
use crate::error::{EngineError, Result};
use crate::loader::source::TensorSource;
use crate::model::{load_shards, DecoderShard, ShardParts};
use crate::spec::model::ModelConfig;
use crate::tp::{AllReduceDtype, Endpoint, LocalComm, PlanOptions, ShardPlan};
use crate::worker::{StageLinks, StageMsg};

/// One future worker.
pub(crate) struct Member {
    pub device: DeviceSpec,
    pub shard: DecoderShard,
    pub layers: Range<usize>,
    pub endpoint: Box<dyn Endpoint>,
    pub links: StageLinks,
    pub returns_logits: bool,
}

pub(crate) struct Placement {
    /// The tensor-parallel plan of each member (world size 1 for pipeline stages).
    pub plan: ShardPlan,
    pub members: Vec<Member>,
    /// How to make the members' communicators again.
    pub groups: CommGroups,
    /// Global rank of the first member (members are consecutive ranks): 0 unless this
    /// process is a worker node of a group of nodes.
    pub first_rank: usize,
    /// KV heads of the rank that holds the most, across every node: all nodes size
    /// their caches alike. `None`: the members are the whole group.
    pub kv_heads_max: Option<usize>,
    /// The connections to the other nodes.
    pub links: NodeLinks,
    /// The routed experts of layers `0..n` are on the host.
    pub host_expert_layers: usize,
}

/// The communicator groups of a placement (all ranks in one for tensor parallelism, one
/// per stage for a pipeline), to make fresh endpoints when a failed step aborted them.
#[derive(Debug, Clone)]
pub(crate) struct CommGroups {
    /// The devices of each group; members are the groups' ranks, in order.
    groups: Vec<Vec<DeviceSpec>>,
    dtype: AllReduceDtype,
    same_gpu: crate::tp::SameGpuComm,
    timeout: Duration,
    /// Why the group cannot be made again, when it cannot (ranks in other processes).
    fixed: Option<&'static str>,
}

impl CommGroups {
    fn new(cfg: &EngineConfig, groups: Vec<Vec<DeviceSpec>>) -> Self {
        Self {
            groups,
            dtype: cfg.allreduce_dtype,
            same_gpu: cfg.same_gpu_comm,
            timeout: cfg.step_timeout,
            fixed: None,
        }
    }

    /// A group that spans processes: it is made once, at rendezvous.
    pub fn spanning_nodes(cfg: &EngineConfig) -> Self {
        Self {
            fixed: Some("a group spanning nodes is formed once, at rendezvous: restart the group"),
            ..Self::new(cfg, Vec::new())
        }
    }

    /// One new endpoint per member, in member order.
    pub fn endpoints(&self) -> Result<Vec<Box<dyn Endpoint>>> {
        if let Some(why) = self.fixed {
            return Err(EngineError::Parallel(why.into()));
        }
        let mut all = Vec::new();
        for devices in &self.groups {
            all.extend(endpoints(self.dtype, self.same_gpu, self.timeout, devices)?);
        }
        Ok(all)
    }
}

/// Tensor parallelism over `cfg.devices`, split by `cfg.tensor_split` ratios.
pub(crate) fn tensor_parallel(
    source: &dyn TensorSource,
    cfg: &EngineConfig,
    config: &ModelConfig,
    input_block: usize,
) -> Result<Placement> {
    let world = cfg.devices.len();
    let devices = cfg
        .devices
        .iter()
        .map(|d| d.open())
        .collect::<Result<Vec<_>>>()?;
    let ratios = match &cfg.tensor_split {
        Some(r) if r.len() != world => {
            return Err(EngineError::Parallel(format!(
                "--tensor-split has {} ratios for {world} devices; give one ratio per device",
                r.len()
            )))
        }
        Some(r) => r.clone(),
        None => default_ratios(&cfg.devices, &devices)?,
    };
    let plan = ShardPlan::new(
        config,
        &PlanOptions {
            ratios,
            input_block,
        },
    )?;
    for (rank, s) in plan.ranks.iter().enumerate() {
        tracing::info!(
            "rank {rank} ({}): query heads {:?}, KV heads {:?}, FFN columns {:?}, vocabulary {:?}",
            cfg.devices[rank],
            s.q_heads,
            s.kv_heads,
            s.ffn,
            s.vocab
        );
    }
    let parts = ShardParts {
        host_expert_layers: cfg.host_expert_layers.unwrap_or(0),
        mtp: cfg.mtp,
        ..ShardParts::WHOLE
    };
    let shards = load_shards(source, &plan, &devices, 0..config.num_layers, &parts)?
        .into_iter()
        .map(|s| path_for(s, cfg, false))
        .collect::<Result<Vec<_>>>()?;
    settle_uploads(&devices)?;
    let groups = CommGroups::new(cfg, vec![cfg.devices.clone()]);
    let comms = groups.endpoints()?;
    let members = shards
        .into_iter()
        .zip(comms)
        .enumerate()
        .map(|(rank, (shard, comm))| Member {
            device: cfg.devices[rank],
            shard,
            layers: 0..config.num_layers,
            endpoint: comm,
            links: StageLinks::default(),
            returns_logits: rank == 0,
        })
        .collect();
    Ok(Placement {
        plan,
        members,
        groups,
        first_rank: 0,
        kv_heads_max: None,
        links: NodeLinks::Single,
        host_expert_layers: parts.host_expert_layers,
    })
}

/// Test builds: with `emulate_gpu`, a shard that is not the host stage's takes the GPU
/// path. Otherwise the shard runs the path its device gave it.
fn path_for(shard: DecoderShard, cfg: &EngineConfig, host: bool) -> Result<DecoderShard> {
    #[cfg(feature = "gpu-emulation")]
    if cfg.emulate_gpu && !host {
        let mut shard = shard;
        shard.take_gpu_path()?;
        return Ok(shard);
    }
    #[cfg(not(feature = "gpu-emulation"))]
    let _ = (cfg, host);
    Ok(shard)
}

/// Pipeline stages from a layer map: whole layers per device (or per tensor-parallel
/// group of devices), host layers last; the routed experts of layers `0..host_experts`
/// on the host.
pub(crate) fn pipeline(
    source: &dyn TensorSource,
    cfg: &EngineConfig,
    config: &ModelConfig,
    input_block: usize,
    map: &LayerMap,
    host_experts: usize,
) -> Result<Placement> {
    if cfg.tensor_split.is_some() {
        return Err(EngineError::Parallel(
            "--tensor-split and --device-layers cannot be combined: a layer map places whole layers".into(),
        ));
    }
    let stages: Vec<Stage> = map.stages(&cfg.devices, config.num_layers)?;
    let groups = CommGroups::new(cfg, stages.iter().map(|s| s.devices.clone()).collect());
    let mut comms = groups.endpoints()?.into_iter();
    // Every stage has as many ranks (the map checks it), so one plan cuts them all.
    let ranks = stages.first().map_or(1, |s| s.devices.len());
    let plan = ShardPlan::new(config, &PlanOptions::equal(ranks, input_block))?;
    let mut members = Vec::with_capacity(stages.len() * ranks);
    // Rank r of a stage hands its hidden states, whole after the stage's all-reduce, to
    // rank r of the next.
    let mut prev: Vec<Option<crossbeam_channel::Receiver<StageMsg>>> =
        (0..ranks).map(|_| None).collect();
    for (i, stage) in stages.iter().enumerate() {
        tracing::info!(
            "stage {i} ({}{}): layers {:?}",
            stage
                .devices
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            if stage.host { ", host" } else { "" },
            stage.layers
        );
        let devices = stage
            .devices
            .iter()
            .map(|d| d.open())
            .collect::<Result<Vec<_>>>()?;
        let last = i + 1 == stages.len();
        let parts = ShardParts {
            embedding: i == 0,
            head: last,
            host_expert_layers: host_experts,
            mtp: false,
        };
        let shards = load_shards(source, &plan, &devices, stage.layers.clone(), &parts)?;
        settle_uploads(&devices)?;
        for (r, (shard, device)) in shards.into_iter().zip(&stage.devices).enumerate() {
            let shard = path_for(shard, cfg, stage.host)?;
            let (next, next_prev) = if last {
                (None, None)
            } else {
                let (tx, rx) = crossbeam_channel::bounded::<StageMsg>(1);
                (Some(tx), Some(rx))
            };
            let comm = comms
                .next()
                .ok_or_else(|| EngineError::Parallel("no communicator".into()))?;
            members.push(Member {
                device: *device,
                shard,
                layers: stage.layers.clone(),
                endpoint: comm,
                links: StageLinks {
                    prev: prev[r].take(),
                    next,
                    timeout: cfg.step_timeout,
                },
                returns_logits: last && r == 0,
            });
            prev[r] = next_prev;
        }
    }
    Ok(Placement {
        plan,
        members,
        groups,
        first_rank: 0,
        kv_heads_max: None,
        links: NodeLinks::Single,
        host_expert_layers: host_experts,
    })
}

/// The communicator endpoints of a group: in-process buffers for CPU ranks, NCCL for
/// ranks on distinct GPUs, and for ranks sharing one GPU the same-GPU communicator (and
/// for a single GPU rank, whose only collective work is bounding its step) or, when
/// `same_gpu` asks for it, NCCL.
fn endpoints(
    dtype: AllReduceDtype,
    same_gpu: crate::tp::SameGpuComm,
    timeout: Duration,
    devices: &[DeviceSpec],
) -> Result<Vec<Box<dyn Endpoint>>> {
    let world = devices.len();
    match devices.first() {
        #[cfg(feature = "cuda")]
        Some(DeviceSpec::Cuda(_)) => {
            let shared = world == 1 || DeviceSpec::shares_one_gpu(devices);
            if shared && (world == 1 || same_gpu == crate::tp::SameGpuComm::Device) {
                return Ok(boxed(crate::tp::DeviceComm::group(world, dtype, timeout)));
            }
            let version = crate::tp::nccl_version::loaded()?;
            tracing::info!("NCCL {version} joins {world} ranks");
            if shared {
                let enabled = std::env::var(crate::tp::nccl_version::MULTI_RANK_VARIABLE).ok();
                if let Some(why) = crate::tp::nccl_version::refuse_ranks_sharing_a_gpu(
                    version,
                    enabled.as_deref(),
                    world,
                ) {
                    return Err(EngineError::Config(why));
                }
            }
            Ok(boxed(crate::tp::NcclEndpoint::group(
                world, dtype, timeout, shared,
            )?))
        }
        _ => {
            if same_gpu == crate::tp::SameGpuComm::Nccl {
                return Err(EngineError::Config(
                    "--same-gpu-comm nccl joins ranks that share one GPU; these are CPU \
                     ranks, which join in the process (leave the flag out)"
                        .into(),
                ));
            }
            Ok(boxed(LocalComm::group(world, dtype, timeout)))
        }
    }
}

/// Shares of the ranks when none are given: equal on CPU ranks and on one shared GPU;
/// across distinct GPUs, in proportion to each one's free memory (a GPU that is half
/// taken by another process gets half the share), rounded by the plan to its granules.
pub(crate) fn default_ratios(
    specs: &[DeviceSpec],
    devices: &[candle_core::Device],
) -> Result<Vec<f64>> {
    let distinct_gpus = specs.len() > 1
        && specs.iter().all(|d| matches!(d, DeviceSpec::Cuda(_)))
        && !DeviceSpec::shares_one_gpu(specs);
    if !distinct_gpus {
        return Ok(vec![1.0; specs.len()]);
    }
    #[cfg(feature = "cuda")]
    {
        let mut free = Vec::with_capacity(devices.len());
        for (spec, d) in specs.iter().zip(devices) {
            let (bytes, _total, _) = crate::device::gpu_memory::measure(d)?;
            tracing::info!("{spec}: {} MiB free", bytes >> 20);
            free.push(bytes);
        }
        Ok(crate::device::gpu_memory::split_by_free_memory(&free))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = devices;
        Ok(vec![1.0; specs.len()])
    }
}

fn boxed<E: Endpoint + 'static>(endpoints: Vec<E>) -> Vec<Box<dyn Endpoint>> {
    endpoints
        .into_iter()
        .map(|e| Box::new(e) as Box<dyn Endpoint>)
        .collect()
}

/// Weights are uploaded from this thread's stream; the workers use them from theirs.
pub(crate) fn settle_uploads(devices: &[candle_core::Device]) -> Result<()> {
    for d in devices {
        d.synchronize()?;
    }
    Ok(())
}
