//! The shard plan: which heads, FFN columns and vocabulary rows each rank holds.
//!
//! Attention is split in whole KV groups (all query heads that share a KV head) while
//! there are at least as many KV heads as ranks. With more ranks than KV heads the query
//! heads are split one by one and each KV head is replicated to every rank whose query
//! heads use it. Row-parallel weights (o_proj, down) split their input dimension, so a
//! rank's columns must cover whole quantization blocks: the granule is the smallest run
//! of units whose width is a multiple of the block.

use std::ops::Range;

use crate::error::{EngineError, Result};
use crate::spec::model::ModelConfig;
use crate::tp::split::{granule_for, split_units, Segment, SplitState};

/// What one rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankShard {
    /// Global query heads of this rank.
    pub q_heads: Range<usize>,
    /// Global KV heads this rank needs (replicated when shared with another rank).
    pub kv_heads: Range<usize>,
    /// Columns of the FFN intermediate dimension.
    pub ffn: Range<usize>,
    /// Rows of the vocabulary in the LM head.
    pub vocab: Range<usize>,
}

impl RankShard {
    /// For each local query head, the local KV head it reads.
    pub fn local_kv_of_q(&self, group_size: usize) -> Vec<usize> {
        self.q_heads
            .clone()
            .map(|h| h / group_size - self.kv_heads.start)
            .collect()
    }
}

/// The whole group's layout.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    pub world_size: usize,
    pub ranks: Vec<RankShard>,
    head_dim: usize,
    num_heads: usize,
    num_kv_heads: usize,
    intermediate_size: usize,
    vocab_size: usize,
}

/// Inputs of a plan beyond the model config.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Relative share of each rank (equal by default); its length is the world size.
    pub ratios: Vec<f64>,
    /// Quantization block (in columns) of the row-parallel weights; 1 for dense weights.
    pub input_block: usize,
}

impl PlanOptions {
    pub fn equal(world_size: usize, input_block: usize) -> Self {
        Self {
            ratios: vec![1.0; world_size],
            input_block,
        }
    }
}

impl ShardPlan {
    pub fn new(config: &ModelConfig, options: &PlanOptions) -> Result<Self> {
        let world = options.ratios.len();
        if world == 0 {
            return Err(EngineError::Parallel(
                "tensor-parallel size must be at least 1".into(),
            ));
        }
        let hd = config.head_dim;
        let group = config.group_size();
        let block = options.input_block.max(1);
        // Whole KV groups while there are enough of them and their width splits on the
        // blocks; otherwise query heads one by one, each rank holding the KV heads its
        // query heads read (replicated where two ranks share one). A KV group narrower
        // than a block (a k-quant's 256 columns) may not split where single heads do.
        let by_groups = (world <= config.num_kv_heads)
            .then(|| {
                split_units(
                    config.num_kv_heads,
                    &options.ratios,
                    granule_for(group * hd, block),
                    "attention (whole KV groups)",
                )
            })
            .and_then(|groups| groups.ok());
        let (q_ranges, kv_ranges) = match by_groups {
            Some(groups) => {
                let q = groups
                    .iter()
                    .map(|g| g.start * group..g.end * group)
                    .collect::<Vec<_>>();
                (q, groups)
            }
            None => {
                let q = split_units(
                    config.num_heads,
                    &options.ratios,
                    granule_for(hd, block),
                    "attention (query heads)",
                )
                .map_err(|e| hint_heads(e, config, block))?;
                let kv = q
                    .iter()
                    .map(|h| h.start / group..(h.end - 1) / group + 1)
                    .collect::<Vec<_>>();
                (q, kv)
            }
        };
        let ffn = split_units(
            config.intermediate_size,
            &options.ratios,
            block,
            "FFN intermediate columns",
        )?;
        let vocab = split_units(config.vocab_size, &options.ratios, 1, "vocabulary rows")?;
        let ranks = (0..world)
            .map(|r| RankShard {
                q_heads: q_ranges[r].clone(),
                kv_heads: kv_ranges[r].clone(),
                ffn: ffn[r].clone(),
                vocab: vocab[r].clone(),
            })
            .collect();
        Ok(Self {
            world_size: world,
            ranks,
            head_dim: hd,
            num_heads: config.num_heads,
            num_kv_heads: config.num_kv_heads,
            intermediate_size: config.intermediate_size,
            vocab_size: config.vocab_size,
        })
    }

    fn per_rank(&self, f: impl Fn(&RankShard) -> Range<usize>) -> Vec<Range<usize>> {
        self.ranks.iter().map(f).collect()
    }

    fn scaled(&self, f: impl Fn(&RankShard) -> Range<usize>, by: usize) -> Vec<Range<usize>> {
        self.per_rank(|r| {
            let x = f(r);
            x.start * by..x.end * by
        })
    }

    /// Fused QKV projection: rows split per segment (Q, K, V), column-parallel.
    pub fn qkv(&self) -> SplitState {
        let hd = self.head_dim;
        SplitState::Split {
            axis: 0,
            segments: vec![
                Segment {
                    len: self.num_heads * hd,
                    ranges: self.scaled(|r| r.q_heads.clone(), hd),
                },
                Segment {
                    len: self.num_kv_heads * hd,
                    ranges: self.scaled(|r| r.kv_heads.clone(), hd),
                },
                Segment {
                    len: self.num_kv_heads * hd,
                    ranges: self.scaled(|r| r.kv_heads.clone(), hd),
                },
            ],
        }
    }

    /// Output projection: input columns split by query head, row-parallel (Partial out).
    pub fn o_proj(&self) -> SplitState {
        SplitState::split(
            1,
            self.num_heads * self.head_dim,
            self.scaled(|r| r.q_heads.clone(), self.head_dim),
        )
    }

    /// Fused gate/up projection: two segments, column-parallel.
    pub fn gate_up(&self) -> SplitState {
        let seg = Segment {
            len: self.intermediate_size,
            ranges: self.per_rank(|r| r.ffn.clone()),
        };
        SplitState::Split {
            axis: 0,
            segments: vec![seg.clone(), seg],
        }
    }

    /// Down projection: input columns split, row-parallel (Partial out).
    pub fn down(&self) -> SplitState {
        SplitState::split(1, self.intermediate_size, self.per_rank(|r| r.ffn.clone()))
    }

    /// LM head: vocabulary rows split; logits are gathered.
    pub fn lm_head(&self) -> SplitState {
        SplitState::split(0, self.vocab_size, self.per_rank(|r| r.vocab.clone()))
    }
}

fn hint_heads(e: EngineError, config: &ModelConfig, block: usize) -> EngineError {
    let granule = granule_for(config.head_dim, block);
    let max = config.num_heads.div_ceil(granule).max(1);
    let what = match e {
        EngineError::Parallel(m) => m,
        other => other.to_string(),
    };
    EngineError::Parallel(format!(
        "{what} (this model has {} query heads and {} KV heads of dimension {}; with \
         quantization blocks of {block} columns it splits over at most {max} ranks)",
        config.num_heads, config.num_kv_heads, config.head_dim
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `num_heads` query heads of 64 on `num_kv_heads` KV heads, an FFN of 1024.
    fn heads(num_heads: usize, num_kv_heads: usize) -> ModelConfig {
        ModelConfig {
            num_heads,
            num_kv_heads,
            head_dim: 64,
            intermediate_size: 1024,
            vocab_size: 100,
            ..ModelConfig::default()
        }
    }

    /// Six heads of 64 in two KV groups of 192 columns, under 256-column blocks (a
    /// Q4_K_M file whose down projection is Q4_K): one rank holds them whole; two cannot
    /// split a group on a block, so they split the query heads on blocks (four and two)
    /// and share the second KV head; four cannot split six heads in blocks of four.
    #[test]
    fn one_rank_never_needs_a_split_on_blocks() -> Result<()> {
        let config = heads(6, 2);
        let plan = ShardPlan::new(&config, &PlanOptions::equal(1, 256))?;
        assert_eq!(plan.ranks[0].q_heads, 0..6);
        assert_eq!(plan.ranks[0].ffn, 0..1024);
        let plan = ShardPlan::new(&config, &PlanOptions::equal(2, 256))?;
        assert_eq!(plan.ranks[0].q_heads, 0..4);
        assert_eq!(plan.ranks[1].q_heads, 4..6);
        assert_eq!(plan.ranks[0].kv_heads, 0..2);
        assert_eq!(plan.ranks[1].kv_heads, 1..2);
        let err = ShardPlan::new(&config, &PlanOptions::equal(4, 256))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("splits over at most 2 ranks"), "{err}");
        assert_eq!(
            err.matches("invalid tensor-parallel setup").count(),
            1,
            "{err}"
        );
        Ok(())
    }

    /// Dense weights, or groups that split on the blocks, keep whole KV groups.
    #[test]
    fn whole_kv_groups_where_they_split() -> Result<()> {
        let config = heads(8, 2);
        for block in [1, 32, 256] {
            let plan = ShardPlan::new(&config, &PlanOptions::equal(2, block))?;
            assert_eq!(plan.ranks[1].q_heads, 4..8, "block {block}");
            assert_eq!(plan.ranks[1].kv_heads, 1..2, "block {block}");
            assert_eq!(plan.ranks[0].kv_heads, 0..1, "block {block}");
        }
        Ok(())
    }
}
