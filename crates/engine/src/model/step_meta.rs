//! A step's metadata for device kernels, packed on the host: positions and cache slots
//! of the tokens, each token's sequence, the block tables (one row of `max_blocks` per
//! sequence, padded), each local query head's local KV head, and the attention tiles of
//! [`AttentionPlan`], in one u32 buffer so a GPU rank uploads it in one copy per step.

use std::ops::Range;

use tessera_kernels::gpu::launch::{AttentionPlan, SeqSpan};

use crate::error::{EngineError, Result};
use crate::model::batch::Batch;

/// Which part of the packed buffer.
#[derive(Debug, Clone, Copy)]
pub enum Part {
    Positions,
    Slots,
    SeqOfToken,
    BlockTables,
    KvOfQ,
    DecodeStart,
    DecodeLen,
    PrefillStart,
    PrefillLen,
}

pub const PARTS: usize = 9;

/// Host side of the metadata: the packed values and where each part lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedMeta {
    pub values: Vec<u32>,
    pub(crate) ranges: [Range<usize>; PARTS],
    pub num_tokens: usize,
    pub max_blocks: usize,
    pub plan: AttentionPlan,
}

fn to_u32(x: usize, what: &str) -> Result<u32> {
    u32::try_from(x).map_err(|_| EngineError::Step(format!("{what} {x} does not fit in 32 bits")))
}

impl PackedMeta {
    /// Packs `batch` for a rank whose query heads read the local KV heads `kv_of_q`;
    /// decode contexts are split for about `target_blocks` thread blocks.
    pub fn new(batch: &Batch, kv_of_q: &[u32], target_blocks: usize) -> Result<Self> {
        let max_blocks = batch
            .seqs
            .iter()
            .map(|s| s.block_table.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let spans: Vec<SeqSpan> = batch
            .seqs
            .iter()
            .map(|s| SeqSpan {
                tokens: s.token_start..s.token_start + s.num_tokens,
                start_pos: s.start_pos,
            })
            .collect();
        let plan = AttentionPlan::new(&spans, kv_of_q.len(), target_blocks);
        Self::pack(batch, kv_of_q, max_blocks, plan)
    }

    /// Packs `batch` with block-table rows of `max_blocks` entries and the attention
    /// launches of `plan` (a plan that serves the batch: a replayed graph's).
    pub fn pack(
        batch: &Batch,
        kv_of_q: &[u32],
        max_blocks: usize,
        plan: AttentionPlan,
    ) -> Result<Self> {
        let n = batch.num_tokens();
        if let Some(s) = batch.seqs.iter().find(|s| s.block_table.len() > max_blocks) {
            return Err(EngineError::Step(format!(
                "a block table of {} blocks in rows of {max_blocks}",
                s.block_table.len()
            )));
        }
        let mut values = Vec::with_capacity(4 * n + batch.seqs.len() * max_blocks + kv_of_q.len());
        let mut ranges: [Range<usize>; PARTS] = Default::default();
        let mut push = |part: Part, items: &mut dyn Iterator<Item = Result<u32>>| -> Result<()> {
            let start = values.len();
            for v in items {
                values.push(v?);
            }
            ranges[part as usize] = start..values.len();
            Ok(())
        };
        push(
            Part::Positions,
            &mut batch.positions.iter().map(|p| to_u32(*p, "position")),
        )?;
        push(
            Part::Slots,
            &mut batch.slots.iter().map(|s| to_u32(*s, "cache slot")),
        )?;
        let seq_of_token = batch
            .seqs
            .iter()
            .enumerate()
            .flat_map(|(i, s)| std::iter::repeat_n(i, s.num_tokens));
        push(
            Part::SeqOfToken,
            &mut seq_of_token.map(|i| to_u32(i, "sequence")),
        )?;
        let tables = batch.seqs.iter().flat_map(|s| {
            (0..max_blocks).map(move |b| Ok(s.block_table.get(b).copied().unwrap_or(0)))
        });
        push(Part::BlockTables, &mut tables.into_iter())?;
        push(Part::KvOfQ, &mut kv_of_q.iter().map(|k| Ok(*k)))?;
        push(
            Part::DecodeStart,
            &mut plan.decode.start.iter().map(|v| Ok(*v)),
        )?;
        push(Part::DecodeLen, &mut plan.decode.len.iter().map(|v| Ok(*v)))?;
        push(
            Part::PrefillStart,
            &mut plan.prefill.start.iter().map(|v| Ok(*v)),
        )?;
        push(
            Part::PrefillLen,
            &mut plan.prefill.len.iter().map(|v| Ok(*v)),
        )?;
        if values.is_empty() {
            values.push(0);
        }
        Ok(Self {
            values,
            ranges,
            num_tokens: n,
            max_blocks,
            plan,
        })
    }

    pub fn range(&self, part: Part) -> Range<usize> {
        self.ranges[part as usize].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::batch::BatchSeq;

    #[test]
    fn packs_tokens_tables_and_tiles_in_order() -> Result<()> {
        // A 20-token prefill chunk at position 4 (blocks 7, 2) and a decoding token at
        // position 9 (blocks 5); block size 16.
        let mut batch = Batch::default();
        for i in 0..20 {
            batch.token_ids.push(1);
            batch.positions.push(4 + i);
            let pos = 4 + i;
            batch.slots.push([7, 2][pos / 16] * 16 + pos % 16);
        }
        batch.token_ids.push(1);
        batch.positions.push(9);
        batch.slots.push(5 * 16 + 9);
        batch.seqs = vec![
            BatchSeq {
                token_start: 0,
                num_tokens: 20,
                start_pos: 4,
                block_table: vec![7, 2],
            },
            BatchSeq {
                token_start: 20,
                num_tokens: 1,
                start_pos: 9,
                block_table: vec![5],
            },
        ];
        let p = PackedMeta::new(&batch, &[0, 0, 1], 1)?;
        let part = |x: Part| p.values[p.range(x)].to_vec();
        assert_eq!(p.num_tokens, 21);
        assert_eq!(p.max_blocks, 2);
        assert_eq!(part(Part::Positions)[19..], [23, 9]);
        assert_eq!(part(Part::Slots)[..2], [7 * 16 + 4, 7 * 16 + 5]);
        assert_eq!(part(Part::Slots)[12], 2 * 16);
        let mut seq = vec![0; 20];
        seq.push(1);
        assert_eq!(part(Part::SeqOfToken), seq);
        assert_eq!(part(Part::BlockTables), [7, 2, 5, 0]);
        assert_eq!(part(Part::KvOfQ), [0, 0, 1]);
        assert_eq!(part(Part::PrefillStart), [0, 16]);
        assert_eq!(part(Part::PrefillLen), [16, 4]);
        assert_eq!(part(Part::DecodeStart), [20]);
        assert_eq!(part(Part::DecodeLen), [1]);
        Ok(())
    }

    #[test]
    fn an_empty_step_still_has_a_buffer_to_upload() -> Result<()> {
        let p = PackedMeta::new(&Batch::default(), &[0], 1)?;
        assert_eq!(p.num_tokens, 0);
        assert!(!p.values.is_empty());
        Ok(())
    }
}
