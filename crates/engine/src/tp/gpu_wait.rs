//! Bounded waits for a GPU stream's queued work, for the CUDA communicators.
//!
//! The GPU cannot notify the host when work completes, so the host records an event and
//! checks it, yielding in between (what a CUDA synchronize does by default), until it
//! completes, the deadline passes, or the group is aborted: a hung kernel or collective
//! fails the step instead of blocking its worker forever.

use std::time::Instant;

use candle_core::cuda::cudarc::driver::CudaStream;

/// Why a wait ended early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    TimedOut,
    Interrupted(String),
    Failed(String),
}

/// Waits for the work queued on `stream` so far. `interrupted` is checked between polls
/// and ends the wait with its reason.
pub(crate) fn wait_for_stream(
    stream: &CudaStream,
    deadline: Instant,
    mut interrupted: impl FnMut() -> Option<String>,
) -> Result<(), WaitEnd> {
    let event = stream
        .record_event(None)
        .map_err(|e| WaitEnd::Failed(format!("recording an event: {e}")))?;
    loop {
        match event.try_is_complete() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(WaitEnd::Failed(format!("CUDA error: {e}"))),
        }
        if let Some(reason) = interrupted() {
            return Err(WaitEnd::Interrupted(reason));
        }
        if Instant::now() >= deadline {
            return Err(WaitEnd::TimedOut);
        }
        std::thread::yield_now();
    }
}
