//! `--device-layers auto`: what each device may use and what each layer takes, measured
//! before any weight is loaded, and the map `device::fit` chooses from them.
//!
//! A device may use what `--device-memory-mib` gives it (CPU ranks, which share the
//! host's memory, must be given it), and a GPU no more than its free memory less the
//! share `--gpu-memory-utilization` leaves to others. A layer takes its weights in the
//! device's compute type (quantized weights as stored) and the KV cache of
//! [`FIT_SEQUENCES`] sequences of `--max-model-len`; every stage keeps room for the
//! activations of the largest step.

use crate::config::EngineConfig;
use crate::device::device_spec::DeviceSpec;
use crate::device::dtype::{compute_dtype_of_kind, kv_cache_dtype};
use crate::device::fit::{self, FitInput, FitPlan, LayerCost, Placed};
use crate::device::host_memory::HostMemory;
use crate::device::layer_map::LayerMap;
use crate::error::{EngineError, Result};
use crate::loader::source::TensorSource;
use crate::loader::weight_bytes::model_weights;
use crate::model::RankCache;
use crate::spec::model::ModelConfig;

/// Sequences of the longest length whose KV cache the map reserves on every stage: the
/// map guarantees one full-length conversation; the KV sizing then fills what is left.
pub const FIT_SEQUENCES: usize = 1;

/// Bytes of f32 activations a step of `tokens` tokens holds at once, per token: the
/// residual and normed hidden states, queries, keys and values, and the MLP's gate and
/// up halves (the widest expert group for a mixture).
pub fn activation_bytes_per_token(config: &ModelConfig) -> usize {
    let ffn = match &config.moe {
        Some(m) => config.intermediate_size.max(m.intermediate_size * m.top_k),
        None => config.intermediate_size,
    };
    let qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim;
    (4 * config.hidden_size + 2 * ffn + qkv) * 4
}

/// The map fitted to the devices of `cfg`, logged.
pub(crate) fn fit(
    source: &dyn TensorSource,
    cfg: &EngineConfig,
    config: &ModelConfig,
) -> Result<(LayerMap, FitPlan)> {
    let input = fit_input(source, cfg, config, cfg.host_expert_layers)?;
    let plan = fit::plan(&input)?;
    tracing::info!(
        "automatic layer map over {} (reserving the KV cache of {FIT_SEQUENCES} sequence of {} tokens per layer):",
        cfg.devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        config.max_position_embeddings
    );
    for line in plan.describe() {
        tracing::info!("  {line}");
    }
    if plan.stages.is_empty() {
        tracing::warn!("no device can hold a layer: the whole model runs on the host");
    }
    Ok((plan.layer_map(), plan))
}

/// Whether tensor parallelism over every device of `cfg` fits what each may use (each
/// rank holds its share of every layer, the embedding and its slice of the head). `None`
/// where nothing bounds the devices (CPU ranks without a `--device-memory-mib` each).
pub(crate) fn tensor_parallel_fits(
    source: &dyn TensorSource,
    cfg: &EngineConfig,
    config: &ModelConfig,
) -> Result<Option<bool>> {
    // CPU ranks share the host's memory: only caps bound them, and all must be capped.
    let bounded = |d: &DeviceSpec| match d {
        DeviceSpec::Cuda(_) => true,
        DeviceSpec::Cpu(_) => cfg.device_memory.of(d).is_some(),
    };
    if !cfg.devices.iter().all(bounded) {
        return Ok(None);
    }
    let input = fit_input(source, cfg, config, Some(0))?;
    let world = cfg.devices.len().max(1);
    let layers: usize = input
        .layers
        .iter()
        .map(|l| l.weights.device + l.experts.device + l.kv.device)
        .sum();
    let per_rank = input.embedding.device
        + (layers + input.head.device) / world
        + input.activations
        + input.logits;
    // Ranks that share a GPU (`cuda:0,cuda:0`) share its memory.
    Ok(Some(input.devices.iter().all(|(device, budget)| {
        let ranks = cfg.devices.iter().filter(|d| *d == device).count();
        ranks * per_rank <= *budget
    })))
}

fn fit_input(
    source: &dyn TensorSource,
    cfg: &EngineConfig,
    config: &ModelConfig,
    host_experts: Option<usize>,
) -> Result<FitInput> {
    cfg.device_memory.check_devices(&cfg.devices)?;
    let weights = model_weights(source)?;
    let device_gpu_path =
        cfg.devices.iter().any(|d| matches!(d, DeviceSpec::Cuda(_))) || cfg.emulates_gpu();
    let dense_bytes = |cuda: bool| compute_dtype_of_kind(cuda).size_in_bytes();
    let first_cuda = matches!(cfg.devices.first(), Some(DeviceSpec::Cuda(_)));
    let (dev_b, host_b) = (dense_bytes(first_cuda), dense_bytes(false));
    let block = cfg.block_size_tokens.max(1);
    let blocks = (config.max_position_embeddings * FIT_SEQUENCES).div_ceil(block);
    let kv_layer = |gpu_path: bool| -> Result<usize> {
        let dtype = kv_cache_dtype(cfg.kv_cache_dtype, gpu_path)?;
        Ok(blocks
            * RankCache::block_bytes_of(dtype, 1, config.num_kv_heads, config.head_dim, block))
    };
    let kv = Placed {
        device: kv_layer(device_gpu_path)?,
        host: kv_layer(false)?,
    };
    let layers = weights
        .layers
        .iter()
        .map(|l| LayerCost {
            weights: Placed {
                device: l.dense_bytes(dev_b),
                host: l.dense_bytes(host_b),
            },
            experts: Placed {
                device: l.expert_bytes(dev_b),
                host: l.expert_bytes(host_b),
            },
            kv,
        })
        .collect();
    let head_rest = config.hidden_size * 4;
    // Each device once: ranks that share a GPU share its memory.
    let mut devices: Vec<(DeviceSpec, usize)> = Vec::with_capacity(cfg.devices.len());
    for d in &cfg.devices {
        if !devices.iter().any(|(seen, _)| seen == d) {
            devices.push((*d, device_budget(cfg, d)?));
        }
    }
    let host_budget = match cfg.device_memory.host {
        Some(b) => b,
        None => HostMemory::read()?.available_bytes,
    };
    Ok(FitInput {
        layers,
        embedding: Placed {
            device: weights.embedding.bytes(dev_b),
            host: weights.embedding.bytes(host_b),
        },
        head: Placed {
            device: weights.head.bytes(dev_b) + head_rest,
            host: weights.head.bytes(host_b) + head_rest,
        },
        activations: cfg.max_batch_tokens * activation_bytes_per_token(config),
        logits: cfg.max_num_seqs * config.vocab_size * 4,
        devices,
        host_budget,
        host_experts,
    })
}

/// What the map may use on `device`: its `--device-memory-mib`, and on a GPU no more than
/// its free memory less the share `--gpu-memory-utilization` leaves to others.
fn device_budget(cfg: &EngineConfig, device: &DeviceSpec) -> Result<usize> {
    let cap = cfg.device_memory.of(device);
    match device {
        DeviceSpec::Cpu(_) => cap.ok_or_else(|| {
            EngineError::Config(format!(
                "--device-layers auto: {device} is a CPU rank, which shares the host's memory; \
                 say what it may use with --device-memory-mib (e.g. {device}=4000)"
            ))
        }),
        DeviceSpec::Cuda(_) => {
            let free = gpu_free_bytes(cfg, device)?;
            Ok(cap.map_or(free, |c| c.min(free)))
        }
    }
}

#[cfg(feature = "cuda")]
fn gpu_free_bytes(cfg: &EngineConfig, device: &DeviceSpec) -> Result<usize> {
    let d = device.open()?;
    let (free, total, _) = crate::device::gpu_memory::measure(&d)?;
    let utilization = cfg.gpu_memory_utilization.unwrap_or(0.9);
    let reserve = (total as f64 * (1.0 - utilization)) as usize;
    let budget = free.saturating_sub(reserve);
    tracing::info!(
        "{device}: {} MiB free of {} MiB, {} MiB of it usable under --gpu-memory-utilization",
        free >> 20,
        total >> 20,
        budget >> 20
    );
    Ok(budget)
}

#[cfg(not(feature = "cuda"))]
fn gpu_free_bytes(_cfg: &EngineConfig, device: &DeviceSpec) -> Result<usize> {
    Err(EngineError::Config(format!(
        "{device}: this build has no CUDA support"
    )))
}
