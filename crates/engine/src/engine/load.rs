//! Loading an engine: the model's file opened, its shards placed on the devices (tensor
//! parallel, pipeline stages, or this node's ranks of a group of nodes), the KV cache
//! sized, and one worker thread started per rank.

use std::collections::HashMap;
use std::time::Instant;

use super::{auto_map, kv_sizing, mtp, nodes, placement, Engine};
use crate::config::EngineConfig;
use crate::device::device_spec::DeviceSpec;
use crate::device::dtype::{kv_cache_dtype, KvCacheDtype};
use crate::device::layer_map::DeviceLayers;
use crate::error::{EngineError, Result};
use crate::loader;
use crate::model::kv_groups::KvGrouping;
use crate::model::RankCache;
use crate::stats::EngineStats;
use crate::worker::{self, WorkerState};

impl Engine {
    /// Loads the model of `cfg` onto its devices and starts a worker per rank.
    pub fn load(cfg: &EngineConfig) -> Result<Engine> {
        let started = Instant::now();
        tracing::info!("opening {}", cfg.model_path.display());
        let source = loader::open::open_served(&cfg.model_path, cfg.max_model_len)?;
        let config = source.config().clone();
        tracing::info!(
            "model: {} layers, hidden {}, {} heads / {} KV heads, vocabulary {}, context {}",
            config.num_layers,
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.vocab_size,
            config.max_position_embeddings
        );
        tracing::info!("RoPE: {}", config.rope_summary());
        let input_block = loader::blocks::row_parallel_block(source.as_ref(), config.num_layers)?;
        #[cfg(feature = "gpu-emulation")]
        if cfg.emulate_gpu && cfg.nodes.as_ref().is_some_and(|n| n.nnodes > 1) {
            return Err(EngineError::Config(
                "emulated GPU ranks run on one node only".into(),
            ));
        }
        check_host_experts(cfg, &config)?;
        let spans_nodes = cfg.nodes.as_ref().is_some_and(|n| n.nnodes > 1);
        if cfg.mtp && (spans_nodes || cfg.device_layers.is_some()) {
            return Err(EngineError::Config(
                "mtp speculation runs the MTP layer with the whole model on each rank's group \
                 (tensor parallelism on one node), not across a layer map's stages or nodes"
                    .into(),
            ));
        }
        let mut placement = match (&cfg.device_layers, &cfg.nodes) {
            (_, Some(nodes)) if nodes.nnodes > 1 => {
                nodes::place(source.as_ref(), cfg, &config, input_block, nodes)?
            }
            (Some(DeviceLayers::Map(map)), _) => {
                let host_experts = cfg.host_expert_layers.unwrap_or(0);
                placement::pipeline(
                    source.as_ref(),
                    cfg,
                    &config,
                    input_block,
                    map,
                    host_experts,
                )?
            }
            (Some(DeviceLayers::Auto), _) => fitted(source.as_ref(), cfg, &config, input_block)?,
            (None, _) => match auto_map::tensor_parallel_fits(source.as_ref(), cfg, &config)? {
                Some(false) if cfg.mtp => {
                    return Err(EngineError::Config(format!(
                        "mtp speculation: the model's weights do not fit the devices given \
                         ({}) by tensor parallelism, and the MTP layer does not run across a \
                         layer map's stages",
                        device_list(&cfg.devices)
                    )))
                }
                Some(false) => {
                    tracing::info!(
                        "the model's weights do not fit the devices given ({}) by tensor \
                         parallelism: fitting a layer map to their memory instead",
                        device_list(&cfg.devices)
                    );
                    fitted(source.as_ref(), cfg, &config, input_block)?
                }
                _ => placement::tensor_parallel(source.as_ref(), cfg, &config, input_block)?,
            },
        };
        tracing::info!("weights loaded in {:.2}s", started.elapsed().as_secs_f64());
        let world = placement.members.len();

        // Each member's cache type; then where its layers keep their KV (hybrid groups
        // share slot tensors), and its bytes for one block.
        let dtypes = placement
            .members
            .iter()
            .map(|m| kv_cache_dtype(cfg.kv_cache_dtype, m.shard.runs_gpu_path()))
            .collect::<Result<Vec<_>>>()?;
        let grouping = kv_grouping(cfg, &config, &dtypes);
        for m in &mut placement.members {
            m.shard
                .set_kv_slots(grouping.for_layers(m.layers.clone()))?;
        }
        let member_blocks = placement
            .members
            .iter()
            .zip(dtypes)
            .map(|(m, dtype)| {
                let kv_heads = placement
                    .kv_heads_max
                    .unwrap_or_else(|| m.shard.num_local_kv_heads());
                let bytes = RankCache::block_bytes_of(
                    dtype,
                    m.shard.num_kv_slots(),
                    kv_heads,
                    config.head_dim,
                    cfg.block_size_tokens,
                );
                Ok((dtype, bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        // Every member holds the same blocks; the one with the most KV per block sizes them.
        let block_bytes = member_blocks.iter().map(|(_, b)| *b).max().unwrap_or(1);
        let dtypes: std::collections::BTreeSet<&str> =
            member_blocks.iter().map(|(d, _)| d.name()).collect();
        let dtypes = dtypes.into_iter().collect::<Vec<_>>().join(" and ");
        let any_gpu = placement
            .members
            .iter()
            .any(|m| matches!(m.device, DeviceSpec::Cuda(_)));
        // With a utilization to honour, start with a cache just large enough for the
        // profile step; it is resized once the step has measured the activations. Every
        // node of a group must hold the same blocks, and sizes them at rendezvous from
        // the KV budget the nodes agreed on.
        if spans_nodes && any_gpu && cfg.gpu_memory_utilization.is_some() {
            tracing::warn!(
                "a group of nodes sizes its KV cache from the KV cache budget ({} MiB per \
                 rank), the same on every node; --gpu-memory-utilization is not used",
                cfg.kv_cache_bytes >> 20
            );
        }
        if spans_nodes && cfg.cpu_kv_sizing.is_some() && !any_gpu {
            tracing::warn!(
                "a group of nodes sizes its KV cache from the KV cache budget ({} MiB per \
                 rank), the same on every node; --cpu-kv-cache-utilization is not used",
                cfg.kv_cache_bytes >> 20
            );
        }
        let gpu_sizing = cfg
            .gpu_memory_utilization
            .filter(|_| any_gpu && !spans_nodes);
        // CPU ranks: a share of the memory the weights left, or the fixed budget.
        let cpu_blocks = match cfg.cpu_kv_sizing.filter(|_| !spans_nodes) {
            Some(sizing) => host_kv_blocks(
                &placement,
                &member_blocks,
                &config,
                cfg,
                &sizing,
                grouping.shape(1, 1).num_groups(),
            )?,
            None => None,
        };
        let fixed_blocks = cfg.kv_cache_bytes / block_bytes.max(1);
        let num_blocks = match (gpu_sizing, cpu_blocks) {
            (Some(_), _) => {
                kv_sizing::profile_plan(
                    cfg.max_batch_tokens,
                    cfg.max_num_seqs,
                    cfg.block_size_tokens,
                    grouping.shape(1, 1).num_groups(),
                )
                .1
            }
            (None, Some(blocks)) if !any_gpu => blocks,
            (None, Some(blocks)) => blocks.min(fixed_blocks),
            (None, None) => fixed_blocks,
        };
        if num_blocks == 0 {
            return Err(EngineError::Config(format!(
                "KV cache budget of {} bytes holds no block of {} tokens ({block_bytes} bytes); raise it",
                cfg.kv_cache_bytes, cfg.block_size_tokens
            )));
        }
        let kv = grouping.shape(num_blocks, cfg.block_size_tokens);
        if let Some(groups) = grouping.describe() {
            tracing::info!("{groups}");
        } else if let Some(window) = kv.attention_window {
            tracing::info!(
                "every layer attends to its last {window} positions: KV blocks behind the \
                 window go back to the pool as a sequence moves on"
            );
        }
        tracing::info!(
            "KV cache{} of {dtypes}: {num_blocks} blocks of {} tokens = {} tokens ({} MiB per \
             device)",
            if gpu_sizing.is_some() {
                " for the profile step"
            } else {
                ""
            },
            cfg.block_size_tokens,
            kv.capacity_tokens(),
            (num_blocks * block_bytes) >> 20
        );
        let threads = cfg.threads_per_rank.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            (cores / world).max(1)
        });
        let plan = placement.plan;
        let groups = placement.groups;
        let stats = EngineStats::new(world);
        let mut workers = Vec::with_capacity(world);
        let mut memory = Vec::with_capacity(world);
        let host_expert_layers = placement.host_expert_layers.min(config.num_layers);
        let layers = placement
            .members
            .iter()
            .map(|m| (m.device, m.layers.clone()))
            .collect();
        for (i, (m, (dtype, _))) in placement
            .members
            .into_iter()
            .zip(&member_blocks)
            .enumerate()
        {
            let rank = placement.first_rank + i;
            let cache = RankCache::new(
                &m.shard.cache_shape(*dtype),
                num_blocks,
                cfg.block_size_tokens,
            )?;
            memory.push(kv_sizing::RankMemory {
                device: m.device,
                handle: m.shard.device().clone(),
                block_bytes: cache.block_bytes(),
            });
            tracing::debug!("worker {rank} on {}", m.device);
            workers.push(worker::spawn(WorkerState {
                rank,
                shard: m.shard,
                cache,
                endpoint: m.endpoint,
                threads,
                links: m.links,
                returns_logits: m.returns_logits,
                stats: stats.rank(i),
            })?);
        }
        let attached = nodes::attach(placement.links, &mut workers, &plan, cfg)?;
        let kv_fp8 = member_blocks
            .iter()
            .any(|(d, _)| *d == KvCacheDtype::Fp8E4m3);
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        let graph_rows = (cfg.decode_graphs
            && (any_gpu || cfg.emulates_gpu())
            && !spans_nodes
            && cfg.device_layers.is_none())
        .then(|| super::graphs::graph_rows(cfg.max_num_seqs, &config));
        let mut engine = Engine {
            workers,
            layers,
            host_expert_layers,
            config,
            plan,
            kv,
            kv_block_bytes: block_bytes,
            kv_fp8,
            sequences: HashMap::new(),
            step_timeout: cfg.step_timeout,
            failed: None,
            groups,
            stats,
            leader: attached.leader,
            node_loss: attached.node_loss,
            mtp: cfg.mtp.then(mtp::MtpSeqs::default),
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            graphs: super::graphs::EngineGraphs {
                rows: graph_rows,
                recorded: None,
            },
        };
        #[cfg(feature = "cuda")]
        if let Some(utilization) = gpu_sizing {
            engine.size_kv_to_gpus(
                &memory,
                utilization,
                cpu_blocks.unwrap_or(fixed_blocks),
                cfg.max_batch_tokens,
                cfg.max_num_seqs,
            )?;
        }
        #[cfg(not(feature = "cuda"))]
        let _ = (gpu_sizing, memory, fixed_blocks);
        // The leader drives every node's ranks through the step; a worker node's ranks
        // take it from the leader.
        if engine.leader.is_none() && kv_fp8 {
            engine.calibrate_kv_scales()?;
        }
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        engine.record_decode_graphs()?;
        tracing::info!(
            "engine ready: {world} rank(s), {threads} thread(s) each, loaded in {:.2}s",
            started.elapsed().as_secs_f64()
        );
        Ok(engine)
    }
}

/// Blocks the KV cache of this process's CPU ranks holds when it takes its share of the
/// memory the weights left (`cfg.cpu_kv_sizing`); `None` when no rank is on a CPU. Every
/// rank holds every block, so the blocks are the budget over the bytes one block takes
/// on all CPU ranks together. Logged, with what was available and what stays free.
fn host_kv_blocks(
    placement: &placement::Placement,
    member_blocks: &[(KvCacheDtype, usize)],
    config: &crate::spec::model::ModelConfig,
    cfg: &EngineConfig,
    sizing: &crate::device::host_memory::CpuKvSizing,
    num_groups: usize,
) -> Result<Option<usize>> {
    use crate::device::host_memory::{cpu_kv_budget, HostMemory};
    let block_bytes: usize = placement
        .members
        .iter()
        .zip(member_blocks)
        .filter(|(m, _)| matches!(m.device, DeviceSpec::Cpu(_)))
        .map(|(_, (_, bytes))| bytes)
        .sum();
    if block_bytes == 0 {
        return Ok(None);
    }
    // Every sequence the scheduler may run, each at the longest context in every KV
    // group, and a block of slack each: more could never be used.
    let needed_blocks = cfg.max_num_seqs.max(1)
        * num_groups
        * (config
            .max_position_embeddings
            .div_ceil(cfg.block_size_tokens.max(1))
            + 1);
    let memory = HostMemory::read()?;
    let budget = cpu_kv_budget(&memory, sizing, needed_blocks.saturating_mul(block_bytes))?;
    let blocks = budget / block_bytes;
    tracing::info!(
        "KV cache on CPU ranks: {} MiB in all ({} of the {} MiB available after the weights, \
         {} MiB kept free for the OS and chat-template sandboxes, at most what {} sequences \
         of {} tokens use): {blocks} blocks",
        (blocks * block_bytes) >> 20,
        sizing.utilization,
        memory.available_bytes >> 20,
        sizing.reserve_bytes >> 20,
        cfg.max_num_seqs,
        config.max_position_embeddings
    );
    Ok(Some(blocks))
}

/// Pipeline stages from the layer map fitted to the devices' memory.
fn fitted(
    source: &dyn loader::TensorSource,
    cfg: &EngineConfig,
    config: &crate::spec::model::ModelConfig,
    input_block: usize,
) -> Result<placement::Placement> {
    let (map, plan) = auto_map::fit(source, cfg, config)?;
    placement::pipeline(
        source,
        cfg,
        config,
        input_block,
        &map,
        plan.host_expert_layers,
    )
}

fn device_list(devices: &[DeviceSpec]) -> String {
    devices
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--cpu-moe` and `--n-cpu-moe` keep experts off a GPU: they need a mixture of experts,
/// and a rank that runs the GPU path.
fn check_host_experts(cfg: &EngineConfig, config: &crate::spec::model::ModelConfig) -> Result<()> {
    if cfg.host_expert_layers.unwrap_or(0) == 0 {
        return Ok(());
    }
    if config.moe.is_none() {
        return Err(EngineError::Config(
            "--cpu-moe / --n-cpu-moe: this model has no mixture-of-experts layers".into(),
        ));
    }
    if !cfg.emulates_gpu() && !cfg.devices.iter().any(|d| matches!(d, DeviceSpec::Cuda(_))) {
        return Err(EngineError::Config(format!(
            "--cpu-moe / --n-cpu-moe keep experts on the host instead of a GPU; the devices \
             ({}) are CPU ranks, whose weights are all on the host already",
            device_list(&cfg.devices)
        )));
    }
    Ok(())
}

/// How the model's layers share the KV cache: hybrid groups when the model mixes
/// sliding and full layers and `--disable-hybrid-kv-cache-manager` is not given. An fp8
/// cache keeps one group: its scales are per layer, set by a layer's first write, and
/// layers of different groups sharing a slot tensor would share them.
fn kv_grouping(
    cfg: &EngineConfig,
    config: &crate::spec::model::ModelConfig,
    dtypes: &[KvCacheDtype],
) -> KvGrouping {
    let grouping = KvGrouping::of_model(config, cfg.hybrid_kv_cache);
    if grouping.hybrid.is_some() && dtypes.contains(&KvCacheDtype::Fp8E4m3) {
        tracing::info!(
            "an fp8 KV cache keeps one block table for all layers (its per-layer scales \
             cannot share slot tensors): sliding layers hold the whole context"
        );
        return KvGrouping::of_model(config, false);
    }
    grouping
}
