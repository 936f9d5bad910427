//! Scheduler metrics: a plain snapshot, and a lock-free cell the engine loop publishes
//! into after every step so handles can read it from any thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::speculation::SpeculationCounters;

/// Guess positions whose acceptance is counted (the most `num_speculative_tokens` allows).
const SPEC_POSITIONS: usize = 16;

/// A point-in-time view of the scheduler. Token counters are in tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerMetrics {
    pub num_running: usize,
    /// Sequences in the scheduler's waiting queue, including preempted ones. (Requests
    /// admitted but still on their way to the loop are not here: see
    /// `SchedulerHandle::num_waiting` for the whole count.)
    pub num_waiting: usize,
    /// Of `num_waiting`, sequences preempted and waiting to restart. They hold no
    /// admission slot, unlike those that never ran.
    pub num_waiting_preempted: usize,
    /// Blocks held by sequences / all blocks (cached-but-free blocks count as free).
    pub kv_usage_fraction: f64,
    pub kv_blocks_in_use: usize,
    pub kv_blocks_total: usize,
    /// Prompt tokens looked up in the prefix cache when sequences (re)started.
    pub prefix_cache_queries_tokens: u64,
    /// Of those, tokens found cached (not recomputed).
    pub prefix_cache_hits_tokens: u64,
    pub preemptions_total: u64,
    /// Steps whose output was applied.
    pub steps_total: u64,
    pub last_step_duration: Duration,
    /// Prompt tokens of requests that started running (each request counted once).
    pub prompt_tokens_total: u64,
    /// Tokens sampled and delivered.
    pub generation_tokens_total: u64,
    /// Speculation: guesses made and kept.
    pub speculation: SpeculationCounters,
}

/// Atomics mirroring [`SchedulerMetrics`]; each field is read and written on its own, so
/// a snapshot may mix two consecutive steps (fine for monitoring).
#[derive(Debug, Default)]
pub struct SharedMetrics {
    num_running: AtomicU64,
    num_waiting: AtomicU64,
    num_waiting_preempted: AtomicU64,
    kv_usage_fraction_bits: AtomicU64,
    kv_blocks_in_use: AtomicU64,
    kv_blocks_total: AtomicU64,
    prefix_cache_queries_tokens: AtomicU64,
    prefix_cache_hits_tokens: AtomicU64,
    preemptions_total: AtomicU64,
    steps_total: AtomicU64,
    last_step_duration_ns: AtomicU64,
    prompt_tokens_total: AtomicU64,
    generation_tokens_total: AtomicU64,
    spec_drafts: AtomicU64,
    spec_draft_tokens: AtomicU64,
    spec_accepted_tokens: AtomicU64,
    spec_positions: AtomicU64,
    spec_accepted_per_position: [AtomicU64; SPEC_POSITIONS],
}

impl SharedMetrics {
    pub fn publish(&self, m: &SchedulerMetrics) {
        let r = Ordering::Relaxed;
        self.num_running.store(m.num_running as u64, r);
        self.num_waiting.store(m.num_waiting as u64, r);
        self.num_waiting_preempted
            .store(m.num_waiting_preempted as u64, r);
        self.kv_usage_fraction_bits
            .store(m.kv_usage_fraction.to_bits(), r);
        self.kv_blocks_in_use.store(m.kv_blocks_in_use as u64, r);
        self.kv_blocks_total.store(m.kv_blocks_total as u64, r);
        self.prefix_cache_queries_tokens
            .store(m.prefix_cache_queries_tokens, r);
        self.prefix_cache_hits_tokens
            .store(m.prefix_cache_hits_tokens, r);
        self.preemptions_total.store(m.preemptions_total, r);
        self.steps_total.store(m.steps_total, r);
        let ns = u64::try_from(m.last_step_duration.as_nanos()).unwrap_or(u64::MAX);
        self.last_step_duration_ns.store(ns, r);
        self.prompt_tokens_total.store(m.prompt_tokens_total, r);
        self.generation_tokens_total
            .store(m.generation_tokens_total, r);
        let s = &m.speculation;
        self.spec_drafts.store(s.drafts, r);
        self.spec_draft_tokens.store(s.draft_tokens, r);
        self.spec_accepted_tokens.store(s.accepted_tokens, r);
        let positions = s.accepted_per_position.len().min(SPEC_POSITIONS);
        self.spec_positions.store(positions as u64, r);
        for (cell, n) in self
            .spec_accepted_per_position
            .iter()
            .zip(&s.accepted_per_position)
        {
            cell.store(*n, r);
        }
    }

    pub fn snapshot(&self) -> SchedulerMetrics {
        let r = Ordering::Relaxed;
        SchedulerMetrics {
            num_running: self.num_running.load(r) as usize,
            num_waiting: self.num_waiting.load(r) as usize,
            num_waiting_preempted: self.num_waiting_preempted.load(r) as usize,
            kv_usage_fraction: f64::from_bits(self.kv_usage_fraction_bits.load(r)),
            kv_blocks_in_use: self.kv_blocks_in_use.load(r) as usize,
            kv_blocks_total: self.kv_blocks_total.load(r) as usize,
            prefix_cache_queries_tokens: self.prefix_cache_queries_tokens.load(r),
            prefix_cache_hits_tokens: self.prefix_cache_hits_tokens.load(r),
            preemptions_total: self.preemptions_total.load(r),
            steps_total: self.steps_total.load(r),
            last_step_duration: Duration::from_nanos(self.last_step_duration_ns.load(r)),
            prompt_tokens_total: self.prompt_tokens_total.load(r),
            generation_tokens_total: self.generation_tokens_total.load(r),
            speculation: SpeculationCounters {
                drafts: self.spec_drafts.load(r),
                draft_tokens: self.spec_draft_tokens.load(r),
                accepted_tokens: self.spec_accepted_tokens.load(r),
                accepted_per_position: self.spec_accepted_per_position
                    [..self.spec_positions.load(r) as usize]
                    .iter()
                    .map(|n| n.load(r))
                    .collect(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_then_snapshot_round_trips() {
        let m = SchedulerMetrics {
            num_running: 3,
            num_waiting: 2,
            num_waiting_preempted: 1,
            kv_usage_fraction: 0.375,
            kv_blocks_in_use: 6,
            kv_blocks_total: 16,
            prefix_cache_queries_tokens: 100,
            prefix_cache_hits_tokens: 48,
            preemptions_total: 1,
            steps_total: 9,
            last_step_duration: Duration::from_micros(1500),
            prompt_tokens_total: 70,
            generation_tokens_total: 30,
            speculation: SpeculationCounters {
                drafts: 4,
                draft_tokens: 12,
                accepted_tokens: 5,
                accepted_per_position: vec![3, 2, 0],
            },
        };
        let shared = SharedMetrics::default();
        shared.publish(&m);
        assert_eq!(shared.snapshot(), m);
    }
}
