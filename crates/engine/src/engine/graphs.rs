//! The ranks' decode graphs, from the engine's side: recorded once the cache has its
//! final size (after the fp8 warm-up step), again after the cache is resized or the group
//! reconnects (the graphs hold the cache's and the communicator's addresses), and dropped
//! everywhere when any rank cannot record them, so every rank takes the same path each
//! step.
//!
//! A recorded plan takes the cache's last block for its padding rows: the scheduler is
//! told of one block fewer.

use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};
use crate::model::cuda::graph_plan::GraphPlan;
use crate::model::moe::DEVICE_ROUTED_ROWS;
use crate::spec::model::ModelConfig;
use crate::worker::Job;

use super::Engine;

/// What the engine knows of its ranks' graphs.
#[derive(Debug, Default)]
pub(crate) struct EngineGraphs {
    /// Record graphs for steps of up to this many sequences; `None`: eager.
    pub rows: Option<usize>,
    /// The plan every rank recorded, while they hold it.
    pub recorded: Option<GraphPlan>,
}

/// The most rows a decode graph of `config` serves: `max_num_seqs`, or for a mixture of
/// experts the steps its experts take on the device alone (larger ones route on the host).
pub(crate) fn graph_rows(max_num_seqs: usize, config: &ModelConfig) -> usize {
    match config.moe {
        Some(_) => max_num_seqs.min(DEVICE_ROUTED_ROWS),
        None => max_num_seqs,
    }
}

impl Engine {
    /// Records a new plan on every rank, taking the cache's last block for padding.
    pub(crate) fn record_decode_graphs(&mut self) -> Result<()> {
        let Some(rows) = self.graphs.rows else {
            return Ok(());
        };
        if self.kv.num_blocks < 2 {
            tracing::info!("decode steps run eagerly: the KV cache has a single block");
            return Ok(());
        }
        let plan = GraphPlan::new(
            rows,
            self.config.max_position_embeddings,
            self.kv.num_blocks - 1,
            self.kv.block_size_tokens,
        );
        if self.record_plan(plan.clone())? {
            self.kv.num_blocks = plan.scratch_block;
            self.graphs.recorded = Some(plan);
        }
        Ok(())
    }

    /// Records the plan the ranks held again (after a reconnect dropped it).
    pub(crate) fn rerecord_decode_graphs(&mut self) -> Result<()> {
        match self.graphs.recorded.take() {
            Some(plan) => {
                if self.record_plan(plan.clone())? {
                    self.graphs.recorded = Some(plan);
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Sends `plan` to every rank; whether every rank recorded it. When one could not,
    /// every rank drops its graphs, and after a failure (rather than a refusal) the
    /// group reconnects. Errors only when the group cannot go on.
    fn record_plan(&mut self, plan: GraphPlan) -> Result<bool> {
        let started = Instant::now();
        let count = plan.keys().count();
        for w in &self.workers {
            w.jobs
                .send(Job::RecordGraphs(plan.clone()))
                .map_err(|_| EngineError::GroupFailed {
                    rank: Some(w.rank),
                    message: "worker thread is gone".into(),
                })?;
        }
        // Each graph is recorded after an eager run of its step.
        let deadline = Instant::now() + self.step_timeout * 2 * (count as u32).max(1);
        let mut refusal: Option<String> = None;
        let mut failure: Option<String> = None;
        for w in &self.workers {
            let wait = deadline.saturating_duration_since(Instant::now());
            match w.results.recv_timeout(wait.max(Duration::from_millis(1))) {
                Ok(Ok(_)) => {}
                Ok(Err(EngineError::Config(why))) => {
                    refusal.get_or_insert(why);
                }
                Ok(Err(e)) => {
                    failure.get_or_insert(e.to_string());
                }
                Err(_) => {
                    return Err(EngineError::GroupFailed {
                        rank: Some(w.rank),
                        message: "did not finish recording decode graphs".into(),
                    })
                }
            }
        }
        if refusal.is_none() && failure.is_none() {
            tracing::info!(
                "decode graphs: {count} recorded ({} batch sizes up to {}, {} context \
                 bounds up to {}) in {:.2}s; --enforce-eager runs every step eagerly",
                plan.buckets.len(),
                plan.buckets.last().copied().unwrap_or(0),
                plan.contexts.len(),
                plan.contexts.last().copied().unwrap_or(0),
                started.elapsed().as_secs_f64()
            );
            return Ok(true);
        }
        for w in &self.workers {
            let _ = w.jobs.send(Job::DropGraphs);
        }
        if let Some(why) = failure {
            tracing::warn!("decode steps run eagerly: recording their graphs failed: {why}");
            self.graphs.rows = None;
            self.reconnect()?;
        } else if let Some(why) = refusal {
            tracing::info!("decode steps run eagerly: {why}");
        }
        Ok(false)
    }
}
