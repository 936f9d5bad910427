//! How long grammar masks take, over every constrained sequence of a model: a lock-free
//! histogram of the time per mask (one mask per constrained token), read by the server
//! as `tessera_structured_output_mask_seconds`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: a mask over a 50k vocabulary takes tens of
/// microseconds when the lexer state is simple and milliseconds inside a long string.
pub const MASK_BUCKETS_SECONDS: [f64; 12] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 1e-1,
];

/// Masks computed and the time each took.
#[derive(Debug)]
pub struct MaskCounters {
    /// `counts[i]` masks fell in bucket `i`; the last is the `+Inf` bucket.
    counts: [AtomicU64; MASK_BUCKETS_SECONDS.len() + 1],
    nanos: AtomicU64,
}

/// A snapshot of [`MaskCounters`].
#[derive(Debug, Clone, PartialEq)]
pub struct MaskTimes {
    /// Bucket upper bounds in seconds ([`MASK_BUCKETS_SECONDS`]).
    pub bounds_seconds: &'static [f64],
    /// Per-bucket (not cumulative) counts; the last entry is the `+Inf` bucket.
    pub counts: Vec<u64>,
    /// Masks computed.
    pub count: u64,
    /// Seconds they took, summed.
    pub sum_seconds: f64,
}

impl Default for MaskCounters {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: AtomicU64::new(0),
        }
    }
}

impl MaskCounters {
    pub(crate) fn record(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = MASK_BUCKETS_SECONDS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(MASK_BUCKETS_SECONDS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> MaskTimes {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        MaskTimes {
            bounds_seconds: &MASK_BUCKETS_SECONDS,
            count: counts.iter().sum(),
            counts,
            sum_seconds: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_land_in_their_buckets_and_sum() {
        let c = MaskCounters::default();
        c.record(Duration::from_micros(5));
        c.record(Duration::from_micros(300));
        c.record(Duration::from_secs(1));
        let t = c.snapshot();
        assert_eq!(t.count, 3);
        assert_eq!(t.counts[0], 1, "5 µs in the first bucket");
        assert_eq!(t.counts[5], 1, "300 µs in the 500 µs bucket");
        assert_eq!(t.counts[MASK_BUCKETS_SECONDS.len()], 1, "1 s in +Inf");
        assert!((t.sum_seconds - 1.000305).abs() < 1e-9, "{}", t.sum_seconds);
    }
}
