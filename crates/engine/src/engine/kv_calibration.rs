//! The warm-up step that fixes an fp8 KV cache's scales: each layer's first write sets
//! one scale per KV head for K and for V (`kv_quant::fp8_scale` of its largest value),
//! and every later write divides by them. It runs at load, after the cache has its final
//! size (a resize starts a cache anew), on tokens of its own, so the scales never depend
//! on which request happens to come first.

use tessera_protocol::{ScheduledChunk, SeqId, StepPlan};

use super::Engine;
use crate::error::Result;
use crate::model::{Batch, ChunkLimits};

/// Tokens of the calibration step (fewer when the cache holds fewer).
const CALIBRATION_TOKENS: usize = 256;

/// One sequence of `tokens` token ids spread over the vocabulary (a fixed stride, so the
/// step is the same on every start), in blocks `0..`.
pub(crate) fn calibration_plan(vocab: usize, tokens: usize, block_size: usize) -> StepPlan {
    let vocab = vocab.max(1) as u64;
    let ids = (0..tokens as u64)
        .map(|i| ((i * 7919 + 11) % vocab) as u32)
        .collect();
    StepPlan {
        new_sequences: vec![],
        scheduled: vec![ScheduledChunk {
            id: SeqId(u64::MAX),
            tokens: ids,
            start_pos: 0,
            block_table: (0..tokens.div_ceil(block_size.max(1)) as u32).collect(),
            sample: true,
            num_draft: 0,
            propose: 0,
            group_tables: Vec::new(),
        }],
        finished: vec![],
    }
}

impl Engine {
    /// Runs the calibration step on every rank. Its blocks are free again right after:
    /// the scheduler has handed none out yet, and their content is never read.
    pub(crate) fn calibrate_kv_scales(&mut self) -> Result<()> {
        let tokens = CALIBRATION_TOKENS
            .min(self.kv.capacity_tokens())
            .min(self.config.max_position_embeddings);
        let plan = calibration_plan(self.config.vocab_size, tokens, self.kv.block_size_tokens);
        let limits = ChunkLimits {
            kv: self.kv,
            max_positions: self.config.max_position_embeddings,
            vocab_rows: self.config.vocab_size,
        };
        self.forward(Batch::from_plan(&plan, &limits)?)?;
        if self.mtp.is_some() {
            // The MTP layer's slot too, from the same tokens.
            self.mtp_calibration_pass(&plan.scheduled, &limits)?;
        }
        tracing::info!("fp8 KV cache: scales set by a warm-up step of {tokens} tokens");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calibration_step_is_fixed_and_fits_its_blocks() {
        let plan = calibration_plan(1000, 40, 16);
        let chunk = &plan.scheduled[0];
        assert_eq!(chunk.tokens.len(), 40);
        assert_eq!(chunk.block_table, vec![0, 1, 2]);
        assert!(chunk.tokens.iter().all(|t| *t < 1000));
        assert_eq!(plan, calibration_plan(1000, 40, 16));
    }
}
