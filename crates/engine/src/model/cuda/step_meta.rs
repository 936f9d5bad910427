//! A step's metadata on the device: packed once per step from the batch
//! ([`PackedMeta`]) and uploaded in one copy, then read by every layer's kernels.

use std::ops::Range;

use candle_core::{Device, Tensor};
use tessera_kernels::gpu::launch::{AttentionPlan, KernelArg};

use crate::device::buffers::Held;
use crate::error::Result;
use crate::model::step_meta::{PackedMeta, Part, PARTS};

/// The metadata of one step on one rank's device.
#[derive(Debug)]
pub struct StepMeta {
    pub num_tokens: usize,
    pub block_size: usize,
    pub max_blocks: usize,
    pub plan: AttentionPlan,
    ranges: [Range<usize>; PARTS],
    packed: Tensor,
}

impl StepMeta {
    /// Uploads `packed` to `device` in one copy.
    pub fn upload(packed: PackedMeta, block_size: usize, device: &Device) -> Result<Self> {
        let len = packed.values.len();
        let tensor = Tensor::from_vec(packed.values, len, device)?;
        Ok(Self {
            num_tokens: packed.num_tokens,
            block_size,
            max_blocks: packed.max_blocks,
            plan: packed.plan,
            ranges: packed.ranges,
            packed: tensor,
        })
    }

    /// The metadata laid out as `layout` says, in `buffer` (a u32 tensor on the device
    /// that holds at least `layout.values`): a replayed graph's, whose values are written
    /// into the same buffer before each replay.
    pub fn on_buffer(layout: &PackedMeta, block_size: usize, buffer: &Tensor) -> Self {
        Self {
            num_tokens: layout.num_tokens,
            block_size,
            max_blocks: layout.max_blocks,
            plan: layout.plan.clone(),
            ranges: layout.ranges.clone(),
            packed: buffer.clone(),
        }
    }

    pub(crate) fn held(&self) -> Result<Held<'_>> {
        Held::new(&self.packed, "step metadata")
    }

    /// The address of one part of the packed metadata.
    pub(crate) fn part(&self, held: &Held<'_>, part: Part) -> Result<KernelArg> {
        held.arg_range(self.ranges[part as usize].clone())
    }
}
