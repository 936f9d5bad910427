//! Which decode steps a CUDA rank replays from a recorded graph, and how a step is padded
//! to the graph that serves it.
//!
//! A graph is recorded per batch-size bucket (1, 2, 4, 8, … and `max_num_seqs`) and per
//! context bound (the longest context, then a quarter of it, and so on down to 1024
//! keys): a replay launches the kernels the recording launched, so the number of rows
//! and the split of each context into partitions are fixed per graph. A step of `n`
//! decoding sequences whose longest context is `c` takes the smallest bucket of at least
//! `n` rows and the smallest bound of at least `c` keys; its extra rows decode token 0 at
//! position 0 into a scratch block that no sequence owns. Prefill, embedding requests and
//! batches past the largest bucket run eagerly.

use crate::model::batch::{Batch, BatchSeq};

/// The smallest context bound; shorter contexts share its graphs.
const MIN_CONTEXT_BOUND: usize = 1024;

/// Identifies one recorded graph: its rows and the longest context it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphKey {
    pub rows: usize,
    pub context: usize,
}

/// The graphs a rank records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphPlan {
    /// Row counts, ascending.
    pub buckets: Vec<usize>,
    /// Context bounds, ascending.
    pub contexts: Vec<usize>,
    /// The block that padding rows write: one the scheduler never hands out.
    pub scratch_block: usize,
    pub block_size: usize,
}

impl GraphPlan {
    /// Graphs for steps of up to `max_num_seqs` sequences with contexts up to
    /// `max_context` keys; padding rows write `scratch_block`.
    pub fn new(
        max_num_seqs: usize,
        max_context: usize,
        scratch_block: usize,
        block_size: usize,
    ) -> Self {
        let max_num_seqs = max_num_seqs.max(1);
        let mut buckets: Vec<usize> = std::iter::successors(Some(1usize), |b| b.checked_mul(2))
            .take_while(|b| *b < max_num_seqs)
            .collect();
        buckets.push(max_num_seqs);
        let max_context = max_context.max(1);
        let mut contexts: Vec<usize> = std::iter::successors(Some(max_context), |c| Some(c / 4))
            .take_while(|c| *c >= MIN_CONTEXT_BOUND)
            .collect();
        if contexts.is_empty() {
            contexts.push(max_context);
        }
        contexts.reverse();
        Self {
            buckets,
            contexts,
            scratch_block,
            block_size: block_size.max(1),
        }
    }

    /// Every graph of the plan.
    pub fn keys(&self) -> impl Iterator<Item = GraphKey> + '_ {
        self.buckets.iter().flat_map(move |&rows| {
            self.contexts
                .iter()
                .map(move |&context| GraphKey { rows, context })
        })
    }

    /// Block-table entries per sequence in the graphs of context bound `context`.
    pub fn max_blocks(&self, context: usize) -> usize {
        context.div_ceil(self.block_size).max(1)
    }

    /// The graph that serves `batch`, if one does: every sequence decodes one token (row
    /// `i` is sequence `i`, every row sampled), nothing is pooled, one KV group.
    pub fn key_for(&self, batch: &Batch) -> Option<GraphKey> {
        let n = batch.seqs.len();
        let decode_only = n > 0
            && batch.num_tokens() == n
            && batch.pool.is_empty()
            && batch.groups.is_empty()
            && batch.sample_rows.len() == n
            && batch.sample_rows.iter().enumerate().all(|(i, r)| *r == i)
            && batch
                .seqs
                .iter()
                .enumerate()
                .all(|(i, s)| s.num_tokens == 1 && s.token_start == i);
        if !decode_only {
            return None;
        }
        let longest = batch.seqs.iter().map(|s| s.start_pos + 1).max()?;
        let tables = batch.seqs.iter().map(|s| s.block_table.len()).max()?;
        let rows = self.buckets.iter().copied().find(|b| *b >= n)?;
        // The smallest bound whose contexts and block-table rows hold the batch's.
        let context = self
            .contexts
            .iter()
            .copied()
            .find(|c| *c >= longest && self.max_blocks(*c) >= tables)?;
        Some(GraphKey { rows, context })
    }

    /// `batch` with padding rows up to `rows`: each decodes token 0 at position 0 into
    /// the first slot of the scratch block.
    pub fn padded(&self, batch: &Batch, rows: usize) -> Batch {
        let mut padded = batch.clone();
        let slot = self.scratch_block * self.block_size;
        for i in batch.seqs.len()..rows {
            padded.token_ids.push(0);
            padded.positions.push(0);
            padded.slots.push(slot);
            padded.seqs.push(BatchSeq {
                token_start: i,
                num_tokens: 1,
                start_pos: 0,
                block_table: vec![self.scratch_block as u32],
            });
            padded.sample_rows.push(i);
        }
        padded.row_reduce.clear();
        padded
    }

    /// A step of `rows` padding rows alone: what a graph is recorded from.
    pub fn warm_up_batch(&self, rows: usize) -> Batch {
        self.padded(&Batch::default(), rows)
    }
}

/// Bytes a rank sets aside for its graphs, before the KV cache takes the rest: the
/// buffers replays read and write (each row's token, the step's metadata, each row's
/// logits in f32) and the activations of the largest bucket's step, estimated from the
/// profile step's peak (`activation_peak` over `profile_tokens` tokens) per row. Graphs
/// replayed on one stream share their activations' memory.
pub fn reserve_bytes(
    plan: &GraphPlan,
    vocab: usize,
    activation_peak: usize,
    profile_tokens: usize,
) -> usize {
    let rows = plan.buckets.last().copied().unwrap_or(0);
    let longest = plan.contexts.last().copied().unwrap_or(1);
    let buffers = rows * (vocab * 4 + 4) + 4 * rows * (plan.max_blocks(longest) + 8) + 4096;
    let activations = activation_peak / profile_tokens.max(1) * rows;
    buffers + activations.min(activation_peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoding(contexts: &[usize], block_size: usize) -> Batch {
        let mut b = Batch::default();
        for (i, &ctx) in contexts.iter().enumerate() {
            b.token_ids.push(5 + i as u32);
            b.positions.push(ctx - 1);
            b.slots.push(block_size * (10 + i) + (ctx - 1) % block_size);
            b.seqs.push(BatchSeq {
                token_start: i,
                num_tokens: 1,
                start_pos: ctx - 1,
                block_table: (0..ctx.div_ceil(block_size) as u32).collect(),
            });
            b.sample_rows.push(i);
        }
        b
    }

    #[test]
    fn buckets_double_up_to_the_largest_batch_and_contexts_step_by_four() {
        let plan = GraphPlan::new(48, 32_768, 99, 16);
        assert_eq!(plan.buckets, vec![1, 2, 4, 8, 16, 32, 48]);
        assert_eq!(plan.contexts, vec![2048, 8192, 32_768]);
        assert_eq!(plan.keys().count(), 21);
        assert_eq!(plan.max_blocks(32_768), 2048);
        assert_eq!(plan.max_blocks(2048), 128);
        // Short models have one bound; one sequence has one bucket.
        let small = GraphPlan::new(1, 600, 7, 16);
        assert_eq!((small.buckets, small.contexts), (vec![1], vec![600]));
        assert_eq!(GraphPlan::new(64, 4096, 0, 16).buckets.last(), Some(&64));
    }

    #[test]
    fn decoding_steps_take_the_smallest_graph_that_holds_them() {
        let plan = GraphPlan::new(16, 8192, 99, 16);
        let key = |ctx: &[usize]| plan.key_for(&decoding(ctx, 16));
        assert_eq!(
            key(&[5]),
            Some(GraphKey {
                rows: 1,
                context: 2048
            })
        );
        assert_eq!(
            key(&[5, 3000, 17]),
            Some(GraphKey {
                rows: 4,
                context: 8192
            })
        );
        assert_eq!(
            key(&[2048; 9]),
            Some(GraphKey {
                rows: 16,
                context: 2048
            })
        );
        // Past the largest bucket, or past the longest context: eager.
        assert_eq!(key(&[5; 17]), None);
        assert_eq!(key(&[8193]), None);
        // A table longer than its context needs takes the bound whose rows hold it.
        let mut ahead = decoding(&[100], 16);
        ahead.seqs[0].block_table = (0..200).collect();
        assert_eq!(
            plan.key_for(&ahead),
            Some(GraphKey {
                rows: 1,
                context: 8192
            })
        );
        ahead.seqs[0].block_table = (0..513).collect();
        assert_eq!(plan.key_for(&ahead), None);
    }

    #[test]
    fn prefill_pooling_and_partial_sampling_run_eagerly() {
        let plan = GraphPlan::new(16, 8192, 99, 16);
        let mut prefill = decoding(&[5, 9], 16);
        prefill.seqs[1].num_tokens = 2;
        prefill.token_ids.push(1);
        prefill.positions.push(9);
        prefill.slots.push(0);
        assert_eq!(plan.key_for(&prefill), None);
        let mut unsampled = decoding(&[5, 9], 16);
        unsampled.sample_rows.pop();
        assert_eq!(plan.key_for(&unsampled), None);
        assert_eq!(plan.key_for(&Batch::default()), None);
        let mut grouped = decoding(&[5], 16);
        grouped.groups.push(Default::default());
        assert_eq!(plan.key_for(&grouped), None);
    }

    #[test]
    fn padding_rows_decode_into_the_scratch_block_alone() {
        let plan = GraphPlan::new(8, 4096, 99, 16);
        let batch = decoding(&[5, 40, 3], 16);
        let padded = plan.padded(&batch, 4);
        assert_eq!(padded.seqs.len(), 4);
        assert_eq!(padded.seqs[..3], batch.seqs[..]);
        assert_eq!(padded.token_ids, vec![5, 6, 7, 0]);
        assert_eq!(padded.positions[3], 0);
        assert_eq!(padded.slots[3], 99 * 16);
        assert_eq!(padded.seqs[3].block_table, vec![99]);
        assert_eq!(padded.sample_rows, vec![0, 1, 2, 3]);
        let warm = plan.warm_up_batch(2);
        assert!(warm.slots.iter().all(|s| *s == 99 * 16));
        assert_eq!(
            plan.key_for(&warm),
            Some(GraphKey {
                rows: 2,
                context: 1024
            })
        );
    }

    #[test]
    fn the_reserve_holds_the_buffers_and_the_largest_steps_activations() {
        let plan = GraphPlan::new(64, 8192, 0, 16);
        // 1 GiB of activations over a 2048-token profile step: 0.5 MiB a row.
        let bytes = reserve_bytes(&plan, 1000, 1 << 30, 2048);
        let buffers = 64 * 4004 + 4 * 64 * (512 + 8) + 4096;
        assert_eq!(bytes, buffers + 64 * (1 << 19));
        // Never more activations than the profile step's own.
        assert_eq!(reserve_bytes(&plan, 1000, 1 << 20, 16), buffers + (1 << 20));
    }
}
