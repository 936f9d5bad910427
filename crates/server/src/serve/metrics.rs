//! What the server measures itself for `/metrics` (`routes::metrics` writes it out with
//! the scheduler's and the engine's counters): per-sequence latencies and HTTP counts.
//!
//! Latencies are measured where the server receives token events, per sequence (a
//! request with `n` choices counts `n` times): time to first token from submit, the gap
//! between consecutive tokens, and submit to the final event.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tessera_protocol::DurationHistogram;

const TTFT_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
];
const ITL_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    10.0, 20.0,
];
const E2E_BUCKETS_SECONDS: &[f64] = &[
    0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0,
    960.0,
];

/// What the server itself measures. One per server, shared through the app state.
#[derive(Debug)]
pub struct ServerMetrics {
    pub time_to_first_token: DurationHistogram,
    pub inter_token_latency: DurationHistogram,
    pub e2e_request_latency: DurationHistogram,
    /// `(route, status)` → responses.
    http_requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self {
            time_to_first_token: DurationHistogram::new(TTFT_BUCKETS_SECONDS),
            inter_token_latency: DurationHistogram::new(ITL_BUCKETS_SECONDS),
            e2e_request_latency: DurationHistogram::new(E2E_BUCKETS_SECONDS),
            http_requests: Mutex::new(BTreeMap::new()),
        }
    }
}

impl ServerMetrics {
    /// Count one response. `route` is a route template (bounded label values).
    pub fn count_http(&self, route: &'static str, status: u16) {
        let mut m = self.http_requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route, status)).or_insert(0) += 1;
    }

    /// Responses so far by route template and status.
    pub fn http_counts(&self) -> BTreeMap<(&'static str, u16), u64> {
        self.http_requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
