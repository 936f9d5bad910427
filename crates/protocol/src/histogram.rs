//! [`DurationHistogram`]: a lock-free histogram of durations over fixed buckets, written
//! from any thread and read as a [`HistogramSnapshot`] for Prometheus (the scheduler's
//! step and queue times, the engine's grammar mask times, the server's request latencies).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Durations counted into buckets with the given upper bounds (seconds; `+Inf` implied).
#[derive(Debug)]
pub struct DurationHistogram {
    bounds_seconds: &'static [f64],
    /// `counts[i]` durations fell in bucket `i`; the last is the `+Inf` bucket.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

/// A snapshot of a [`DurationHistogram`].
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Bucket upper bounds in seconds.
    pub bounds_seconds: &'static [f64],
    /// Per-bucket (not cumulative) counts; the last entry is the `+Inf` bucket.
    pub counts: Vec<u64>,
    /// Durations recorded, summed, in seconds.
    pub sum_seconds: f64,
    /// Durations recorded.
    pub count: u64,
}

impl DurationHistogram {
    pub fn new(bounds_seconds: &'static [f64]) -> Self {
        Self {
            bounds_seconds,
            counts: (0..=bounds_seconds.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn record(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        let bucket = self
            .bounds_seconds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds_seconds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Back to no durations (what was recorded before a server's start is not traffic).
    pub fn clear(&self) {
        for c in self.counts.iter() {
            c.store(0, Ordering::Relaxed);
        }
        self.sum_ns.store(0, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        HistogramSnapshot {
            bounds_seconds: self.bounds_seconds,
            count: counts.iter().sum(),
            counts,
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_their_buckets_and_sum() {
        static BOUNDS: [f64; 3] = [1e-5, 5e-4, 1e-1];
        let h = DurationHistogram::new(&BOUNDS);
        h.record(Duration::from_micros(5));
        h.record(Duration::from_micros(300));
        h.record(Duration::from_micros(500));
        h.record(Duration::from_secs(1));
        let s = h.snapshot();
        assert_eq!(s.counts, vec![1, 2, 0, 1], "the bound is inside its bucket");
        assert_eq!(s.count, 4);
        assert!((s.sum_seconds - 1.000805).abs() < 1e-9, "{}", s.sum_seconds);
    }
}
