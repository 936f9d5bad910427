//! What the engine loop reports about itself for health checks and monitoring: whether
//! it is still running, whether its executor is failing, and a histogram of step
//! durations. Written only by the loop thread, read from any thread without locks.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tessera_protocol::{DurationHistogram, HistogramSnapshot};

/// Upper bounds (seconds) of the step-duration histogram buckets; `+Inf` is implied.
pub const STEP_DURATION_BUCKETS_SECONDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A point-in-time view of the loop's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopHealth {
    /// The loop thread has not exited (neither shut down nor stopped by a panic).
    pub running: bool,
    /// The executor panicked, so the loop stopped for good.
    pub panicked: bool,
    /// The executor reported itself failed for good (a rank failed or hung), so the
    /// loop failed every request and stopped. Only a restart helps.
    pub executor_failed: bool,
    /// Executor steps that failed in a row (0 after any successful step).
    pub consecutive_step_failures: u32,
    pub step_failures_total: u64,
}

/// A duration histogram (steps, queue times): per-bucket counts (not cumulative), their
/// sum and count.
pub type StepDurations = HistogramSnapshot;

#[derive(Debug)]
pub(crate) struct LoopStats {
    running: AtomicBool,
    panicked: AtomicBool,
    executor_failed: AtomicBool,
    consecutive_step_failures: AtomicU32,
    step_failures_total: AtomicU64,
    steps: DurationHistogram,
    queue: DurationHistogram,
}

impl Default for LoopStats {
    fn default() -> Self {
        Self {
            running: AtomicBool::new(true),
            panicked: AtomicBool::new(false),
            executor_failed: AtomicBool::new(false),
            consecutive_step_failures: AtomicU32::new(0),
            step_failures_total: AtomicU64::new(0),
            steps: DurationHistogram::new(&STEP_DURATION_BUCKETS_SECONDS),
            queue: DurationHistogram::new(&STEP_DURATION_BUCKETS_SECONDS),
        }
    }
}

impl LoopStats {
    /// Record one executor call; `outcome` is whether it succeeded, `None` when it
    /// does not count for health.
    pub(crate) fn record_step(&self, duration: Duration, outcome: Option<bool>) {
        let r = Ordering::Relaxed;
        self.steps.record(duration);
        match outcome {
            Some(true) => self.consecutive_step_failures.store(0, r),
            Some(false) => {
                self.consecutive_step_failures.fetch_add(1, r);
                self.step_failures_total.fetch_add(1, r);
            }
            None => {}
        }
    }

    pub(crate) fn mark_stopped(&self, panicked: bool) {
        if panicked {
            self.panicked.store(true, Ordering::Release);
        }
        self.running.store(false, Ordering::Release);
    }

    /// The executor failed for good; the loop is about to stop.
    pub(crate) fn mark_executor_failed(&self) {
        self.executor_failed.store(true, Ordering::Release);
        self.running.store(false, Ordering::Release);
    }

    pub(crate) fn health(&self) -> LoopHealth {
        LoopHealth {
            running: self.running.load(Ordering::Acquire),
            panicked: self.panicked.load(Ordering::Acquire),
            executor_failed: self.executor_failed.load(Ordering::Acquire),
            consecutive_step_failures: self.consecutive_step_failures.load(Ordering::Relaxed),
            step_failures_total: self.step_failures_total.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn step_durations(&self) -> StepDurations {
        self.steps.snapshot()
    }

    pub(crate) fn record_queue_time(&self, duration: Duration) {
        self.queue.record(duration);
    }

    pub(crate) fn clear_queue_times(&self) {
        self.queue.clear();
    }

    pub(crate) fn queue_durations(&self) -> StepDurations {
        self.queue.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_land_in_buckets_and_failures_reset_on_success() {
        let stats = LoopStats::default();
        stats.record_step(Duration::from_micros(500), Some(true));
        stats.record_step(Duration::from_millis(20), Some(false));
        stats.record_step(Duration::from_secs(60), Some(false));
        let h = stats.health();
        assert_eq!((h.consecutive_step_failures, h.step_failures_total), (2, 2));
        stats.record_step(Duration::from_millis(20), None);
        assert_eq!(stats.health().consecutive_step_failures, 2);
        stats.record_step(Duration::from_millis(20), Some(true));
        assert_eq!(stats.health().consecutive_step_failures, 0);
        let d = stats.step_durations();
        assert_eq!(d.count, 5);
        assert_eq!(d.counts[0], 1);
        assert_eq!(d.counts[4], 3); // <= 25 ms
        assert_eq!(d.counts[STEP_DURATION_BUCKETS_SECONDS.len()], 1);
        assert!((d.sum_seconds - 60.0605).abs() < 1e-6);
        stats.mark_stopped(true);
        let h = stats.health();
        assert!(!h.running && h.panicked && !h.executor_failed);
        let failed = LoopStats::default();
        failed.mark_executor_failed();
        let h = failed.health();
        assert!(!h.running && !h.panicked && h.executor_failed);
    }
}
