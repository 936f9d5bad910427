//! What a CUDA rank keeps beside its decoder weights: the RoPE tables on the device,
//! each local query head's local KV head, each layer's attention sinks, and how many
//! thread blocks fill the GPU.

use candle_core::{Device, Tensor};

use crate::device::buffers::Gpu;
use crate::error::Result;
use crate::model::cuda::kernels::RopeTables;
use crate::model::rope::RopeTable;
use crate::spec::model::ModelConfig;

/// What a CUDA rank keeps beside its weights: the RoPE tables on the device (and those of
/// sliding-window layers with their own base), each local query head's local KV head,
/// each layer's attention sinks, and how many thread blocks fill the GPU.
#[derive(Debug, Clone)]
pub(crate) struct GpuParts {
    pub(super) rope: RopeTables,
    pub(super) rope_sliding: Option<RopeTables>,
    /// Tables that rotate nothing, for layers without RoPE (the kernel always rotates).
    pub(super) rope_unrotated: Option<RopeTables>,
    pub(super) kv_of_q: Vec<u32>,
    /// gpt-oss: each layer's sink logits of the local query heads, f32 on the device.
    pub(super) sinks: Vec<Option<Tensor>>,
    pub(super) target_blocks: usize,
}

fn tables(device: &Device, rope: &RopeTable) -> Result<RopeTables> {
    let (cos, sin) = rope.tables_on(device)?;
    Ok(RopeTables {
        cos,
        sin,
        interleaved: rope.interleaved(),
        rotary_half: rope.rotary_half(),
    })
}

impl GpuParts {
    /// The parts of a shard of `config` on `device`: its RoPE tables (`(all layers,
    /// sliding layers)`), each local query head's local KV head, and each layer's sinks
    /// (`sinks`, one entry per layer).
    pub(super) fn new<'a>(
        device: &Device,
        config: &ModelConfig,
        (rope, rope_sliding): (&RopeTable, Option<&RopeTable>),
        kv_of_q: &[usize],
        sinks: impl Iterator<Item = Option<&'a [f32]>>,
    ) -> Result<Self> {
        Ok(Self {
            sinks: sinks
                .map(|s| {
                    s.map(|s| Tensor::from_slice(s, s.len(), device))
                        .transpose()
                })
                .collect::<candle_core::Result<_>>()?,
            rope: tables(device, rope)?,
            rope_sliding: rope_sliding.map(|r| tables(device, r)).transpose()?,
            rope_unrotated: config
                .nope_layers
                .contains(&true)
                .then(|| tables(device, &rope.identity_like()))
                .transpose()?,
            kv_of_q: kv_of_q.iter().map(|k| *k as u32).collect(),
            target_blocks: 2 * multiprocessors(device)?,
        })
    }
}

/// The multiprocessors of a CUDA device; an emulated one claims 4, so that decoding
/// short contexts is already split into partitions.
fn multiprocessors(device: &Device) -> Result<usize> {
    Gpu::of(device)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let sms = dev
            .cuda_stream()
            .context()
            .attribute(
                candle_core::cuda::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| {
                crate::error::EngineError::Parallel(format!("CUDA device attribute: {e}"))
            })?;
        return Ok(sms.max(1) as usize);
    }
    Ok(4)
}
