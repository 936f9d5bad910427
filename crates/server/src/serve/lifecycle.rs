//! The server's life as orchestrators see it: loading → warming up → started, then
//! draining on shutdown; and the probes that report it (`/livez`, `/startupz`,
//! `/readyz`, `/health`).
//!
//! - live: the process answers and its engine loop has not died (a dead loop, a failed
//!   device rank or an executor failing step after step is only fixed by a restart;
//!   after a rank failure the process also exits by itself, see [`super::EngineFailure`]);
//! - started: the model is loaded and a warm-up generation has run;
//! - ready: started, not draining, and the engine loop accepts and completes work.
//!
//! The probes read atomics and the scheduler's lock-free health, so they stay fast
//! while the engine is busy.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tessera_scheduler::SchedulerHandle;
use tokio::sync::watch;

/// Executor steps failing in a row before the engine counts as failed (not ready, not
/// live). One failed step is often transient (the scheduler fails that batch and keeps
/// serving); several in a row mean the device or model is broken.
pub const FAILED_STEPS_UNHEALTHY: u32 = 3;

const LOADING: u8 = 0;
const WARMING_UP: u8 = 1;
const STARTED: u8 = 2;

/// Shared by the probes, the start-up sequence and the shutdown drain.
#[derive(Debug)]
pub struct Lifecycle {
    phase: AtomicU8,
    draining: AtomicBool,
    scheduler: OnceLock<SchedulerHandle>,
    /// Sequences submitted whose response has not finished (see [`InFlightGuard`]).
    in_flight: watch::Sender<usize>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            phase: AtomicU8::new(LOADING),
            draining: AtomicBool::new(false),
            scheduler: OnceLock::new(),
            in_flight: watch::Sender::new(0),
        }
    }
}

/// Held by every submitted sequence until its response is done; drain waits for none.
#[derive(Debug)]
pub struct InFlightGuard(watch::Sender<usize>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Lifecycle {
    /// The model is loaded; warm-up comes next.
    pub fn set_loaded(&self, scheduler: SchedulerHandle) {
        let _ = self.scheduler.set(scheduler);
        self.phase.store(WARMING_UP, Ordering::Release);
    }

    /// Warm-up finished: the server is started (and ready unless something else says no).
    pub fn set_started(&self) {
        self.phase.store(STARTED, Ordering::Release);
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn in_flight(&self) -> usize {
        *self.in_flight.borrow()
    }

    pub fn track_in_flight(&self) -> InFlightGuard {
        self.in_flight.send_modify(|n| *n += 1);
        InFlightGuard(self.in_flight.clone())
    }

    /// Resolves once no sequence is in flight.
    pub async fn wait_idle(&self) {
        let mut rx = self.in_flight.subscribe();
        // `Err` only if the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// `Err(reason)` while not started: `loading` or `warming_up`.
    pub fn startup(&self) -> Result<(), &'static str> {
        match self.phase.load(Ordering::Acquire) {
            LOADING => Err("loading"),
            WARMING_UP => Err("warming_up"),
            _ => Ok(()),
        }
    }

    /// `Err(reason)` when the engine loop is dead or failing.
    pub fn liveness(&self) -> Result<(), &'static str> {
        let Some(scheduler) = self.scheduler.get() else {
            return Ok(());
        };
        let health = scheduler.health();
        if health.executor_failed {
            Err("engine_failed")
        } else if health.panicked {
            Err("engine_stopped")
        } else if health.consecutive_step_failures >= FAILED_STEPS_UNHEALTHY {
            Err("engine_failing")
        } else {
            Ok(())
        }
    }

    /// `Err(reason)` when requests should not be sent here.
    pub fn readiness(&self) -> Result<(), &'static str> {
        self.startup()?;
        if self.draining.load(Ordering::Acquire) {
            return Err("draining");
        }
        self.liveness()?;
        match self.scheduler.get() {
            Some(s) if s.health().running => Ok(()),
            _ => Err("engine_stopped"),
        }
    }
}

fn probe(result: Result<(), &'static str>) -> Response {
    match result {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": reason})),
        )
            .into_response(),
    }
}

/// `GET /livez`: 200 while the process can serve at all.
pub async fn livez(State(lc): State<Arc<Lifecycle>>) -> Response {
    probe(lc.liveness())
}

/// `GET /startupz`: 200 once the model is loaded and warmed up.
pub async fn startupz(State(lc): State<Arc<Lifecycle>>) -> Response {
    probe(lc.startup())
}

/// `GET /readyz` (and its alias `/health`): 200 when requests can be served now.
pub async fn readyz(State(lc): State<Arc<Lifecycle>>) -> Response {
    probe(lc.readiness())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn phases_gate_startup_and_readiness() {
        let lc = Lifecycle::default();
        assert_eq!(lc.liveness(), Ok(()));
        assert_eq!(lc.startup(), Err("loading"));
        assert_eq!(lc.readiness(), Err("loading"));
        lc.phase.store(WARMING_UP, Ordering::Release);
        assert_eq!(lc.readiness(), Err("warming_up"));
        lc.set_started();
        assert_eq!(lc.startup(), Ok(()));
        // Started but no scheduler: nothing can run.
        assert_eq!(lc.readiness(), Err("engine_stopped"));
    }

    #[tokio::test]
    async fn in_flight_guards_count_and_wake_the_drain() {
        let lc = Arc::new(Lifecycle::default());
        let a = lc.track_in_flight();
        let b = lc.track_in_flight();
        assert_eq!(lc.in_flight(), 2);
        let waiter = tokio::spawn({
            let lc = Arc::clone(&lc);
            async move { lc.wait_idle().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("drain wakes when the last guard drops")
            .unwrap();
    }
}
