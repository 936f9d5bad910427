//! A step's tokens flattened across sequences, with the KV slots they write.

use tessera_kernels::gpu::reference::StepSeq;
use tessera_protocol::{KvCacheShape, PoolingKind, ScheduledChunk, StepPlan};

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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    pub token_ids: Vec<u32>,
    pub positions: Vec<usize>,
    /// Per token, the physical cache slot (`block * block_size + offset`) it writes.
    pub slots: Vec<usize>,
    pub seqs: Vec<BatchSeq>,
    /// Flattened rows whose logits are wanted, one per sampled sequence, in plan order.
    pub sample_rows: Vec<usize>,
    /// Per sample row, what of its logits the sampler needs; a GPU rank reduces the row
    /// on the device to that instead of copying it. Empty: every row's logits.
    pub row_reduce: Vec<RowReduce>,
    /// Embedding sequences' chunks, whose final hidden states are pooled instead of
    /// sampled (their chunks have no sample row). Read only by the rank that returns
    /// logits.
    pub pool: Vec<PoolSpan>,
    /// With hybrid KV groups, where groups 1.. write and read (group 0's are `slots` and
    /// the sequences' `block_table`); empty with one group.
    pub groups: Vec<GroupAddress>,
}

/// One KV group's addressing in a batch: each token's slot and each sequence's table.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct GroupAddress {
    pub slots: Vec<usize>,
    pub tables: Vec<Vec<u32>>,
}

/// One embedding sequence's chunk in a batch: what its final hidden states give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpan {
    /// The chunk's first row in the flattened batch.
    pub token_start: usize,
    pub num_tokens: usize,
    /// The position of its first token (0: the chunk holds the prompt's first token).
    pub start_pos: usize,
    pub kind: PoolingKind,
}

/// What of one sampled row's logits the host needs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RowReduce {
    /// The whole row (bias, penalties, log-probabilities, a grammar mask).
    Logits,
    /// Its arg-max only (plain greedy sampling).
    Argmax,
    /// The tokens a draw at this temperature can pick (`sampler::sampling_candidates`).
    Candidates { temperature: f32 },
    /// The next token with its log-probability and the `top` most likely tokens' (a
    /// greedy row at temperature 0): the row's arg-max, its log-sum-exp, and its
    /// candidates at `max(temperature, 1)`, which hold the drawn token and, when there are
    /// at least `top` of them, the `top` most likely ones (`Sampler::sample_scored`).
    Scored { temperature: f32, top: usize },
}

impl RowReduce {
    /// The temperature the device gathers this row's candidates at (0: none).
    pub fn candidate_temperature(&self) -> f32 {
        match self {
            RowReduce::Candidates { temperature } => *temperature,
            RowReduce::Scored { temperature, .. } => temperature.max(1.0),
            RowReduce::Logits | RowReduce::Argmax => 0.0,
        }
    }
}

/// What a chunk must fit to run: the cache, the positions and the embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLimits {
    /// The cache the block tables index; with an attention window, entries before the
    /// window of a chunk's first position are released and never read.
    pub kv: KvCacheShape,
    pub max_positions: usize,
    /// Rows of the token embedding: a token id at or past it has no embedding.
    pub vocab_rows: usize,
}

impl ChunkLimits {
    /// Why `chunk` cannot run, if it cannot. A refusal belongs to that chunk's sequence
    /// alone: the rest of the step runs without it.
    pub fn check(&self, chunk: &ScheduledChunk) -> std::result::Result<(), String> {
        if chunk.tokens.is_empty() {
            return Err(format!("{} scheduled with no tokens", chunk.id));
        }
        if chunk.num_draft > 0 && (!chunk.sample || chunk.num_draft >= chunk.tokens.len()) {
            return Err(format!(
                "{}: {} guesses in a chunk of {} tokens that samples {}",
                chunk.id,
                chunk.num_draft,
                chunk.tokens.len(),
                if chunk.sample { "once" } else { "nothing" }
            ));
        }
        if let Some(bad) = chunk
            .tokens
            .iter()
            .find(|t| **t as usize >= self.vocab_rows)
        {
            return Err(format!(
                "{}: token id {bad} is outside the model's embedding of {} rows",
                chunk.id, self.vocab_rows
            ));
        }
        let end = chunk.end_pos();
        if end > self.max_positions {
            return Err(format!(
                "{} reaches position {end}, beyond the model's {}",
                chunk.id, self.max_positions
            ));
        }
        let needed = end.div_ceil(self.kv.block_size_tokens);
        for g in 0..self.kv.num_groups() {
            let Some(table) = chunk_table(chunk, g) else {
                return Err(format!("{}: no block table for KV group {g}", chunk.id));
            };
            if table.len() < needed {
                return Err(format!(
                    "{}: block table of group {g} has {} blocks, {needed} needed for {end} \
                     tokens",
                    chunk.id,
                    table.len()
                ));
            }
            let live = self
                .kv
                .group_first_live_block(g, chunk.start_pos)
                .min(needed);
            if let Some(b) = table[live..needed]
                .iter()
                .find(|b| **b as usize >= self.kv.num_blocks)
            {
                return Err(format!(
                    "{}: block {b} is outside the cache of {} blocks",
                    chunk.id, self.kv.num_blocks
                ));
            }
        }
        Ok(())
    }
}

/// `chunk`'s block table of KV group `group`.
fn chunk_table(chunk: &ScheduledChunk, group: usize) -> Option<&[u32]> {
    match group {
        0 => Some(&chunk.block_table),
        g => chunk.group_tables.get(g - 1).map(Vec::as_slice),
    }
}

impl Batch {
    /// The batch of kernel checks: sequences with given block tables and new positions,
    /// every token id 0, nothing sampled.
    pub fn of_steps(seqs: &[StepSeq], block_size: usize) -> Batch {
        let mut batch = Batch::default();
        for s in seqs {
            let token_start = batch.token_ids.len();
            for pos in s.start_pos..s.start_pos + s.num_tokens {
                batch.token_ids.push(0);
                batch.positions.push(pos);
                batch.slots.push(s.slot(pos, block_size));
            }
            batch.seqs.push(BatchSeq {
                token_start,
                num_tokens: s.num_tokens,
                start_pos: s.start_pos,
                block_table: s.block_table.clone(),
            });
        }
        batch
    }

    /// Flattens a plan, checking every chunk against `limits`; any refusal fails it.
    pub fn from_plan(plan: &StepPlan, limits: &ChunkLimits) -> Result<Batch> {
        Self::from_chunks(plan.scheduled.iter(), limits)
    }

    /// Flattens chunks, in order, checking each against `limits`.
    pub fn from_chunks<'a>(
        chunks: impl IntoIterator<Item = &'a ScheduledChunk>,
        limits: &ChunkLimits,
    ) -> Result<Batch> {
        let block_size = limits.kv.block_size_tokens;
        let mut batch = Batch {
            groups: vec![GroupAddress::default(); limits.kv.num_groups() - 1],
            ..Batch::default()
        };
        for chunk in chunks {
            limits.check(chunk).map_err(EngineError::Step)?;
            let needed = chunk.end_pos().div_ceil(block_size);
            let token_start = batch.token_ids.len();
            for (i, &tok) in chunk.tokens.iter().enumerate() {
                let pos = chunk.start_pos + i;
                batch.token_ids.push(tok);
                batch.positions.push(pos);
                let block = chunk.block_table[pos / block_size] as usize;
                batch.slots.push(block * block_size + pos % block_size);
            }
            if chunk.sample {
                // The last token's row, and one after each speculative guess.
                let end = token_start + chunk.tokens.len();
                batch
                    .sample_rows
                    .extend(end - 1 - chunk.num_draft.min(chunk.tokens.len() - 1)..end);
            }
            batch.seqs.push(BatchSeq {
                token_start,
                num_tokens: chunk.tokens.len(),
                start_pos: chunk.start_pos,
                block_table: chunk.block_table[..needed].to_vec(),
            });
            // `check` saw every group's table cover the chunk.
            for (i, group) in batch.groups.iter_mut().enumerate() {
                let table = chunk_table(chunk, i + 1).unwrap_or(&[]);
                let slot =
                    |pos: usize| table[pos / block_size] as usize * block_size + pos % block_size;
                group
                    .slots
                    .extend((chunk.start_pos..chunk.end_pos()).map(slot));
                group.tables.push(table[..needed].to_vec());
            }
        }
        Ok(batch)
    }

    /// KV groups this batch addresses.
    pub fn num_groups(&self) -> usize {
        1 + self.groups.len()
    }

    /// This batch as KV group `group`'s layers see it: that group's slots and tables in
    /// place of group 0's. Built once per step per group, not per layer.
    pub fn group_view(&self, group: usize) -> Result<Batch> {
        let Some(address) = self.groups.get(group.wrapping_sub(1)) else {
            return Err(EngineError::Step(format!(
                "a step of {} KV groups has no group {group}",
                self.num_groups()
            )));
        };
        if address.slots.len() != self.slots.len() || address.tables.len() != self.seqs.len() {
            return Err(EngineError::Step(format!(
                "KV group {group}: {} slots and {} tables for {} tokens in {} sequences",
                address.slots.len(),
                address.tables.len(),
                self.slots.len(),
                self.seqs.len()
            )));
        }
        let mut view = Batch {
            token_ids: self.token_ids.clone(),
            positions: self.positions.clone(),
            slots: address.slots.clone(),
            seqs: self.seqs.clone(),
            sample_rows: self.sample_rows.clone(),
            row_reduce: self.row_reduce.clone(),
            pool: self.pool.clone(),
            groups: Vec::new(),
        };
        for (seq, table) in view.seqs.iter_mut().zip(&address.tables) {
            seq.block_table.clone_from(table);
        }
        Ok(view)
    }

    /// Per KV group, the batch its layers read: `self` for group 0, a view for the rest.
    pub fn group_views(&self) -> Result<Vec<std::borrow::Cow<'_, Batch>>> {
        let mut views = vec![std::borrow::Cow::Borrowed(self)];
        for g in 1..self.num_groups() {
            views.push(std::borrow::Cow::Owned(self.group_view(g)?));
        }
        Ok(views)
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}
