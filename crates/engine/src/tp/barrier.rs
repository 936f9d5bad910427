//! A barrier for the ranks of one process that can be aborted and that gives up after a
//! timeout, naming the ranks that did not arrive. Waiting is a condition variable with a
//! timeout: no polling, no global lock.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};

pub(crate) struct AbortableBarrier {
    state: Mutex<BarrierState>,
    wake: Condvar,
    world: usize,
    timeout: Duration,
}

struct BarrierState {
    arrived: Vec<bool>,
    count: usize,
    generation: u64,
    aborted: Option<String>,
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking rank never holds this lock across user code; recover the guard.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl AbortableBarrier {
    pub(crate) fn new(world: usize, timeout: Duration) -> Self {
        Self {
            state: Mutex::new(BarrierState {
                arrived: vec![false; world],
                count: 0,
                generation: 0,
                aborted: None,
            }),
            wake: Condvar::new(),
            world,
            timeout,
        }
    }

    pub(crate) fn wait(&self, rank: usize) -> Result<()> {
        let mut st = relock(&self.state);
        if let Some(reason) = &st.aborted {
            return Err(EngineError::CommAborted(reason.clone()));
        }
        let generation = st.generation;
        st.arrived[rank] = true;
        st.count += 1;
        if st.count == self.world {
            st.count = 0;
            st.arrived.iter_mut().for_each(|a| *a = false);
            st.generation += 1;
            self.wake.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..self.world).filter(|r| !st.arrived[*r]).collect();
                let reason = format!(
                    "rank {rank} waited {:?} for ranks {missing:?} at a collective",
                    self.timeout
                );
                st.aborted.get_or_insert(reason.clone());
                self.wake.notify_all();
                return Err(EngineError::CommAborted(reason));
            }
            let (guard, _) = self
                .wake
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner());
            st = guard;
            if st.generation != generation {
                return Ok(());
            }
            if let Some(reason) = &st.aborted {
                return Err(EngineError::CommAborted(reason.clone()));
            }
        }
    }

    pub(crate) fn abort(&self, reason: &str) {
        let mut st = relock(&self.state);
        st.aborted.get_or_insert_with(|| reason.to_string());
        self.wake.notify_all();
    }
}
