//! Per-rank counters the workers keep while they run: steps, time in steps, and time in
//! collectives (all-reduce, all-gather), for the server's metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use candle_core::Tensor;

use crate::error::Result;
use crate::tp::Communicator;

/// One rank's counters. Written only by that rank's worker; read by anyone.
#[derive(Debug, Default)]
pub struct RankStats {
    steps: AtomicU64,
    graph_steps: AtomicU64,
    step_nanos: AtomicU64,
    collectives: AtomicU64,
    collective_nanos: AtomicU64,
}

/// A snapshot of one rank's counters.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RankSnapshot {
    pub steps: u64,
    /// Of those, steps replayed from a CUDA graph.
    pub graph_steps: u64,
    pub step_seconds: f64,
    pub collectives: u64,
    pub collective_seconds: f64,
}

impl RankStats {
    pub(crate) fn record_step(&self, took: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }

    pub(crate) fn record_graph_step(&self) {
        self.graph_steps.fetch_add(1, Ordering::Relaxed);
    }

    fn record_collective(&self, took: Duration) {
        self.collectives.fetch_add(1, Ordering::Relaxed);
        self.collective_nanos
            .fetch_add(nanos(took), Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> RankSnapshot {
        RankSnapshot {
            steps: self.steps.load(Ordering::Relaxed),
            graph_steps: self.graph_steps.load(Ordering::Relaxed),
            step_seconds: self.step_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            collectives: self.collectives.load(Ordering::Relaxed),
            collective_seconds: self.collective_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Every rank's counters; cheap to clone and keep after the engine moves to its loop.
#[derive(Debug, Clone)]
pub struct EngineStats {
    ranks: Arc<Vec<Arc<RankStats>>>,
}

impl EngineStats {
    pub(crate) fn new(world: usize) -> Self {
        Self {
            ranks: Arc::new((0..world).map(|_| Arc::new(RankStats::default())).collect()),
        }
    }

    pub(crate) fn rank(&self, rank: usize) -> Arc<RankStats> {
        self.ranks.get(rank).cloned().unwrap_or_default()
    }

    /// Per rank, in rank order.
    pub fn snapshot(&self) -> Vec<RankSnapshot> {
        self.ranks.iter().map(|r| r.snapshot()).collect()
    }
}

/// A communicator that counts the time spent in its collectives.
pub(crate) struct TimedComm {
    pub inner: Box<dyn Communicator>,
    pub stats: Arc<RankStats>,
}

impl TimedComm {
    fn timed<T>(&mut self, f: impl FnOnce(&mut dyn Communicator) -> Result<T>) -> Result<T> {
        let started = std::time::Instant::now();
        let out = f(self.inner.as_mut());
        self.stats.record_collective(started.elapsed());
        out
    }
}

impl Communicator for TimedComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn all_reduce_sum(&mut self, x: &Tensor) -> Result<Tensor> {
        self.timed(|c| c.all_reduce_sum(x))
    }

    fn all_gather(&mut self, x: &Tensor, dim: usize) -> Result<Tensor> {
        self.timed(|c| c.all_gather(x, dim))
    }

    fn broadcast(&mut self, x: &Tensor, root: usize) -> Result<Tensor> {
        self.timed(|c| c.broadcast(x, root))
    }

    fn barrier(&mut self) -> Result<()> {
        self.timed(|c| c.barrier())
    }

    fn abort(&self, reason: &str) {
        self.inner.abort(reason);
    }

    fn graph_refusal(&self) -> Option<String> {
        self.inner.graph_refusal()
    }

    /// Not counted as collective time: on a GPU it waits for the whole step's work.
    fn settle(&mut self) -> Result<()> {
        self.inner.settle()
    }
}
