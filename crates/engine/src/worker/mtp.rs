//! MTP passes on a worker: the job, where its hidden states come from, and what the
//! worker keeps between a step and the passes after it.

use candle_core::Tensor;

use crate::error::{EngineError, Result};
use crate::model::{Batch, DecoderShard, RankCache};
use crate::tp::Communicator;

/// One pass of the model's MTP layer: its batch (each row's token is the one after its
/// position), and where each row's hidden state comes from.
#[derive(Debug)]
pub(crate) struct MtpJob {
    pub batch: Batch,
    pub hidden: MtpHidden,
    /// Per row of `batch`, its row in that source.
    pub rows: Vec<u32>,
}

/// Where an MTP pass reads its hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MtpHidden {
    /// The latest step's decoder output, by its rows (the final norm is applied).
    Model,
    /// The previous MTP pass's output at its sampled rows, by their order.
    Chain,
}

/// What a worker keeps between a step and the MTP passes after it (a shard with an MTP
/// layer only).
#[derive(Default)]
pub(super) struct MtpInputs {
    /// The latest step's decoder output, `[tokens, hidden]`.
    pub(super) model: Option<Tensor>,
    /// The latest MTP pass's output at its sampled rows.
    chain: Option<Tensor>,
}

impl MtpInputs {
    /// The MTP layer over `job`; the logits of its sampled rows.
    pub(super) fn run(
        &mut self,
        shard: &DecoderShard,
        job: &MtpJob,
        cache: &mut RankCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        // Each source is read by one pass (the step's output by the first pass after it,
        // each pass's output by the next) and held no longer.
        let source = match job.hidden {
            MtpHidden::Model => self.model.take(),
            MtpHidden::Chain => self.chain.take(),
        };
        let source = source.ok_or_else(|| {
            EngineError::Step(format!(
                "an MTP pass before any {:?} hidden states",
                job.hidden
            ))
        })?;
        let rows = Tensor::from_slice(&job.rows, job.rows.len(), source.device())?;
        let mut hidden = source.index_select(&rows, 0)?;
        if job.hidden == MtpHidden::Model {
            hidden = shard.final_norm(&hidden)?;
        }
        let (y, logits) = shard.mtp(&job.batch, &hidden, cache, comm)?;
        let sampled: Vec<u32> = job.batch.sample_rows.iter().map(|r| *r as u32).collect();
        let sampled = Tensor::from_slice(&sampled, sampled.len(), y.device())?;
        self.chain = Some(y.index_select(&sampled, 0)?);
        Ok(logits)
    }
}
