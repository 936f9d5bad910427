//! Sizing the KV cache to the GPUs (`--gpu-memory-utilization`): the workers start with
//! a provisional cache just large enough for a profile step at the largest batch the
//! scheduler may send; after that step the engine reads, per GPU, what the weights,
//! library workspaces and the step's activations took, gives the KV cache what is left
//! under the utilization, and has every worker replace its cache.

use candle_core::Device;
use tessera_protocol::{ScheduledChunk, SeqId, StepPlan};

use super::Engine;
use crate::device::device_spec::DeviceSpec;

/// A step of `tokens` tokens spread over up to `seqs` sequences (each sampling one row),
/// in blocks `0..` of each of `groups` KV groups: the most a step can hold. Returns the
/// plan and the blocks it uses.
pub(crate) fn profile_plan(
    tokens: usize,
    seqs: usize,
    block_size: usize,
    groups: usize,
) -> (StepPlan, usize) {
    let seqs = seqs.clamp(1, tokens.max(1));
    let mut scheduled = Vec::with_capacity(seqs);
    let mut next_block = 0u32;
    for s in 0..seqs {
        let n = tokens / seqs + usize::from(s < tokens % seqs);
        let blocks = n.div_ceil(block_size).max(1) as u32;
        let mut tables = (0..groups.max(1) as u32).map(|g| {
            let first = next_block + g * blocks;
            (first..first + blocks).collect::<Vec<u32>>()
        });
        scheduled.push(ScheduledChunk {
            id: SeqId(s as u64),
            tokens: vec![0; n.max(1)],
            start_pos: 0,
            block_table: tables.next().unwrap_or_default(),
            sample: true,
            num_draft: 0,
            propose: 0,
            group_tables: tables.collect(),
        });
        next_block += blocks * groups.max(1) as u32;
    }
    let plan = StepPlan {
        new_sequences: vec![],
        scheduled,
        finished: vec![],
    };
    (plan, next_block as usize)
}

/// One rank as the sizing sees it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct RankMemory {
    pub device: DeviceSpec,
    pub handle: Device,
    /// KV bytes per block of this rank's cache.
    pub block_bytes: usize,
}

impl Engine {
    /// Runs the profile step and resizes every rank's cache to fit its device.
    #[cfg(feature = "cuda")]
    pub(crate) fn size_kv_to_gpus(
        &mut self,
        ranks: &[RankMemory],
        utilization: f64,
        cpu_max_blocks: usize,
        max_batch_tokens: usize,
        max_num_seqs: usize,
    ) -> crate::error::Result<()> {
        use std::collections::BTreeMap;

        use crate::device::gpu_memory::{kv_budget_per_rank, measure, reset_peak, DeviceUsage};
        use crate::error::EngineError;
        use crate::model::{Batch, ChunkLimits};
        let bs = self.kv.block_size_tokens;
        let provisional_blocks = self.kv.num_blocks;
        // One handle per GPU, and how many ranks share it.
        let mut gpus: BTreeMap<usize, (Device, usize)> = BTreeMap::new();
        for r in ranks {
            if let DeviceSpec::Cuda(i) = r.device {
                gpus.entry(i).or_insert_with(|| (r.handle.clone(), 0)).1 += 1;
            }
        }
        for (device, _) in gpus.values() {
            reset_peak(device)?;
        }
        let (plan, _) = profile_plan(max_batch_tokens, max_num_seqs, bs, self.kv.num_groups());
        let started = std::time::Instant::now();
        let limits = ChunkLimits {
            kv: self.kv,
            max_positions: self.config.max_position_embeddings,
            vocab_rows: self.config.vocab_size,
        };
        let batch = Batch::from_plan(&plan, &limits)?;
        self.forward(batch)?;
        tracing::info!(
            "profile step of {max_batch_tokens} tokens in {} sequences: {:.2}s",
            plan.scheduled.len(),
            started.elapsed().as_secs_f64()
        );
        let mut budgets: BTreeMap<usize, usize> = BTreeMap::new();
        for (&ordinal, (device, ranks_here)) in &gpus {
            let (free, total, pool) = measure(device)?;
            let provisional: usize = ranks
                .iter()
                .filter(|r| r.device == DeviceSpec::Cuda(ordinal))
                .map(|r| r.block_bytes * provisional_blocks)
                .sum();
            let usage = DeviceUsage {
                total_bytes: total,
                used_bytes: (total - free).saturating_sub(pool.reserved.saturating_sub(pool.used)),
                activation_peak_bytes: pool.used_high.saturating_sub(pool.used),
                provisional_kv_bytes: provisional,
            };
            let budget = kv_budget_per_rank(&usage, utilization, *ranks_here)
                .map_err(|e| EngineError::Config(format!("cuda:{ordinal}: {e}")))?;
            // Each rank's decode graphs: their buffers and the activations they keep.
            let graph_reserve = self.graphs.rows.map_or(0, |rows| {
                use crate::model::cuda::graph_plan::{reserve_bytes, GraphPlan};
                let plan = GraphPlan::new(rows, self.config.max_position_embeddings, 0, bs);
                reserve_bytes(
                    &plan,
                    self.config.vocab_size,
                    usage.activation_peak_bytes,
                    max_batch_tokens,
                )
            });
            if graph_reserve > 0 {
                tracing::info!(
                    "cuda:{ordinal}: {} MiB for each rank's decode graphs (--enforce-eager: none)",
                    graph_reserve >> 20
                );
            }
            let budget = budget.saturating_sub(graph_reserve);
            tracing::info!(
                "cuda:{ordinal}: {} MiB total; model, workspaces and context {} MiB; activation peak {} MiB; \
                 KV cache {} MiB for each of its {ranks_here} rank(s) (utilization {utilization})",
                total >> 20,
                usage.used_bytes.saturating_sub(provisional) >> 20,
                usage.activation_peak_bytes >> 20,
                budget >> 20
            );
            budgets.insert(ordinal, budget);
        }
        let num_blocks = ranks
            .iter()
            .map(|r| {
                let budget = match r.device {
                    DeviceSpec::Cuda(i) => budgets.get(&i).copied().unwrap_or(0),
                    DeviceSpec::Cpu(_) => return cpu_max_blocks,
                };
                budget / r.block_bytes.max(1)
            })
            .min()
            .unwrap_or(0);
        if num_blocks == 0 {
            return Err(EngineError::Config(
                "no KV cache block fits in the memory left; raise --gpu-memory-utilization".into(),
            ));
        }
        self.resize_cache(num_blocks)
    }

    /// Replace every rank's cache with one of `num_blocks` blocks (what the old one
    /// held is gone), and set the new one's fp8 scales.
    pub fn resize_cache(&mut self, num_blocks: usize) -> crate::error::Result<()> {
        use crate::error::EngineError;
        use crate::worker::Job;
        let bs = self.kv.block_size_tokens;
        for w in &self.workers {
            w.jobs
                .send(Job::ResizeCache {
                    num_blocks,
                    block_size: bs,
                })
                .map_err(|_| EngineError::Rank {
                    rank: w.rank,
                    message: "worker thread is gone".into(),
                })?;
        }
        for w in &self.workers {
            match w.results.recv() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(EngineError::Rank {
                        rank: w.rank,
                        message: "worker thread exited".into(),
                    })
                }
            }
        }
        self.kv = tessera_protocol::KvCacheShape {
            num_blocks,
            ..self.kv
        };
        tracing::info!(
            "KV cache: {num_blocks} blocks of {bs} tokens = {} tokens per sequence set",
            self.kv.capacity_tokens()
        );
        if self.kv_fp8 && self.leader.is_none() {
            self.calibrate_kv_scales()?;
        }
        // The ranks dropped their graphs with the old cache.
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        if self.graphs.recorded.take().is_some() {
            self.record_decode_graphs()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Result;
    use crate::model::{Batch, ChunkLimits};
    use tessera_protocol::KvCacheShape;

    #[test]
    fn the_profile_step_is_the_largest_the_scheduler_sends() -> Result<()> {
        let (plan, blocks) = profile_plan(2048, 64, 16, 1);
        assert_eq!(plan.scheduled.len(), 64);
        let tokens: usize = plan.scheduled.iter().map(|c| c.tokens.len()).sum();
        assert_eq!(tokens, 2048);
        assert_eq!(blocks, 64 * 2);
        // Every block is used once: the plan is a valid step over `blocks` blocks.
        let limits = ChunkLimits {
            kv: KvCacheShape::new(blocks, 16),
            max_positions: 4096,
            vocab_rows: 1,
        };
        let batch = Batch::from_plan(&plan, &limits)?;
        assert_eq!(batch.sample_rows.len(), 64);
        // Fewer tokens than sequences: one token each.
        let (plan, blocks) = profile_plan(5, 64, 16, 1);
        assert_eq!((plan.scheduled.len(), blocks), (5, 5));
        // Hybrid KV groups: every group of every sequence has blocks of its own.
        let (plan, blocks) = profile_plan(64, 2, 16, 3);
        assert_eq!(blocks, 2 * 2 * 3);
        let hybrid = ChunkLimits {
            kv: KvCacheShape {
                attention_window: Some(8),
                hybrid: Some(tessera_protocol::KvGroups {
                    full: 1,
                    sliding: 2,
                }),
                ..KvCacheShape::new(blocks, 16)
            },
            max_positions: 4096,
            vocab_rows: 1,
        };
        let batch = Batch::from_plan(&plan, &hybrid)?;
        assert_eq!(batch.groups.len(), 2);
        assert_eq!(batch.groups[1].tables[1], vec![10, 11]);
        Ok(())
    }
}
