//! A step's metadata on the device: packed once per step from the batch
//! ([`PackedMeta`]) and uploaded in one copy, then read by every layer's kernels.

use std::ops::Range;

use candle_core::cuda::cudarc::driver::CudaView;
use candle_core::{Device, Tensor};
use tessera_kernels::gpu::launch::AttentionPlan;

use crate::error::Result;
use crate::model::cuda::buffers::Held;
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

    pub(crate) fn held(&self) -> Result<Held<'_>> {
        Held::new(&self.packed, "step metadata")
    }

    fn part<'a>(&self, held: &'a Held<'_>, part: Part) -> Result<CudaView<'a, u32>> {
        held.view_range::<u32>(self.ranges[part as usize].clone())
    }

    pub(crate) fn positions<'a>(&self, h: &'a Held<'_>) -> Result<CudaView<'a, u32>> {
        self.part(h, Part::Positions)
    }
    pub(crate) fn slots<'a>(&self, h: &'a Held<'_>) -> Result<CudaView<'a, u32>> {
        self.part(h, Part::Slots)
    }
    pub(crate) fn seq_of_token<'a>(&self, h: &'a Held<'_>) -> Result<CudaView<'a, u32>> {
        self.part(h, Part::SeqOfToken)
    }
    pub(crate) fn block_tables<'a>(&self, h: &'a Held<'_>) -> Result<CudaView<'a, u32>> {
        self.part(h, Part::BlockTables)
    }
    pub(crate) fn kv_of_q<'a>(&self, h: &'a Held<'_>) -> Result<CudaView<'a, u32>> {
        self.part(h, Part::KvOfQ)
    }
    pub(crate) fn decode_tiles<'a>(
        &self,
        h: &'a Held<'_>,
    ) -> Result<(CudaView<'a, u32>, CudaView<'a, u32>)> {
        Ok((
            self.part(h, Part::DecodeStart)?,
            self.part(h, Part::DecodeLen)?,
        ))
    }
    pub(crate) fn prefill_tiles<'a>(
        &self,
        h: &'a Held<'_>,
    ) -> Result<(CudaView<'a, u32>, CudaView<'a, u32>)> {
        Ok((
            self.part(h, Part::PrefillStart)?,
            self.part(h, Part::PrefillLen)?,
        ))
    }
}
