//! A step's tokens flattened across sequences, with the KV slots they write.

use tessera_protocol::StepPlan;

use crate::error::{EngineError, Result};

/// One sequence's part of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSeq {
    /// Index of the sequence's first token in the flattened batch.
    pub token_start: usize,
    pub num_tokens: usize,
    /// Position of the first token (tokens before it are already in the cache).
    pub start_pos: usize,
    pub block_table: Vec<u32>,
}

/// Everything a forward pass needs, identical on every rank.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    pub token_ids: Vec<u32>,
    pub positions: Vec<usize>,
    /// Per token, the physical cache slot (`block * block_size + offset`) it writes.
    pub slots: Vec<usize>,
    pub seqs: Vec<BatchSeq>,
    /// Flattened rows whose logits are wanted, one per sampled sequence, in plan order.
    pub sample_rows: Vec<usize>,
    /// Per sample row, whether only its arg-max is needed (plain greedy sampling): a GPU
    /// rank then reduces the row on the device instead of copying its logits. Empty:
    /// every row's logits.
    pub argmax_rows: Vec<bool>,
}

impl Batch {
    /// Flattens a plan, checking every block table against the cache.
    pub fn from_plan(
        plan: &StepPlan,
        block_size: usize,
        num_blocks: usize,
        max_positions: usize,
    ) -> Result<Batch> {
        let mut batch = Batch::default();
        for chunk in &plan.scheduled {
            if chunk.tokens.is_empty() {
                return Err(EngineError::Step(format!(
                    "{} scheduled with no tokens",
                    chunk.id
                )));
            }
            let end = chunk.end_pos();
            if end > max_positions {
                return Err(EngineError::Step(format!(
                    "{} reaches position {end}, beyond the model's {max_positions}",
                    chunk.id
                )));
            }
            let needed = end.div_ceil(block_size);
            if chunk.block_table.len() < needed {
                return Err(EngineError::Step(format!(
                    "{}: block table has {} blocks, {needed} needed for {end} tokens",
                    chunk.id,
                    chunk.block_table.len()
                )));
            }
            if let Some(b) = chunk.block_table[..needed]
                .iter()
                .find(|b| **b as usize >= num_blocks)
            {
                return Err(EngineError::Step(format!(
                    "{}: block {b} is outside the cache of {num_blocks} blocks",
                    chunk.id
                )));
            }
            let token_start = batch.token_ids.len();
            for (i, &tok) in chunk.tokens.iter().enumerate() {
                let pos = chunk.start_pos + i;
                batch.token_ids.push(tok);
                batch.positions.push(pos);
                let block = chunk.block_table[pos / block_size] as usize;
                batch.slots.push(block * block_size + pos % block_size);
            }
            if chunk.sample {
                batch.sample_rows.push(token_start + chunk.tokens.len() - 1);
            }
            batch.seqs.push(BatchSeq {
                token_start,
                num_tokens: chunk.tokens.len(),
                start_pos: chunk.start_pos,
                block_table: chunk.block_table[..needed].to_vec(),
            });
        }
        Ok(batch)
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}
