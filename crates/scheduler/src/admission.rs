//! Admission control: the synchronous yes/no a request gets before any stream opens.
//!
//! `Admission` is shared (an `Arc`) between the scheduler and every handle, so `submit`
//! answers immediately from atomics without waiting for the engine loop. A request that
//! is admitted holds a [`QueuePermit`] until it first runs (or ends); dropping the permit
//! returns the slot, so the waiting count can never leak.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use std::sync::OnceLock;
use tessera_protocol::{GenerationRequest, SeqId};

use crate::token_channel::{token_channel, TokenReceiver, TokenSender, Wake};

use crate::config::ResolvedConfig;
use crate::error::AdmissionError;

/// Shared admission state: static limits plus the live count of waiting requests.
pub struct Admission {
    max_waiting: usize,
    max_model_len: usize,
    /// Longest context the KV cache holds for one sequence.
    max_sequence_tokens: usize,
    /// Requests admitted that have not yet run their first step (includes those still in
    /// the engine loop's command channel). Preempted sequences do not count: they were
    /// admitted already, and refusing new work cannot help them.
    waiting: AtomicUsize,
    next_id: AtomicU64,
    closed: AtomicBool,
    /// Events each request's channel holds unread.
    max_buffered_events: usize,
    /// Wakes the engine loop when a stalled client reads (set by the loop).
    wake: OnceLock<Wake>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("max_waiting", &self.max_waiting)
            .field("waiting", &self.num_waiting())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// A slot in the waiting queue; dropping it gives the slot back.
#[derive(Debug)]
pub struct QueuePermit {
    admission: Arc<Admission>,
}

impl Drop for QueuePermit {
    fn drop(&mut self) {
        self.admission.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An admitted request on its way to the scheduler, with the sending half of its
/// event channel.
#[derive(Debug)]
pub struct AdmittedRequest {
    pub id: SeqId,
    pub request: GenerationRequest,
    pub sender: TokenSender,
    pub permit: QueuePermit,
    /// When admission accepted the request (queue time runs from here).
    pub submitted: std::time::Instant,
}

impl Admission {
    pub fn new(cfg: &ResolvedConfig) -> Arc<Self> {
        Arc::new(Self {
            max_waiting: cfg.max_waiting,
            max_model_len: cfg.max_model_len,
            max_sequence_tokens: cfg.max_sequence_tokens(),
            waiting: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            max_buffered_events: cfg.max_buffered_events,
            wake: OnceLock::new(),
        })
    }

    /// How receivers wake the engine loop; set once, by the loop, before any admit.
    pub(crate) fn set_wake(&self, wake: Wake) {
        let _ = self.wake.set(wake);
    }

    /// Most requests that may wait to start (`max_waiting`).
    pub fn max_waiting(&self) -> usize {
        self.max_waiting
    }

    /// Requests admitted and not yet running.
    pub fn num_waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Refuse every later request with `ShuttingDown`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Limits that do not depend on load: a request failing them can never run.
    pub fn check_fits(&self, req: &GenerationRequest) -> Result<(), AdmissionError> {
        let prompt_tokens = req.prompt_ids.len();
        let max_tokens = req.stop.max_tokens;
        if prompt_tokens == 0 {
            return Err(AdmissionError::Invalid("the prompt has no tokens"));
        }
        if max_tokens == 0 {
            return Err(AdmissionError::Invalid("max_tokens must be at least 1"));
        }
        let needed = prompt_tokens.saturating_add(max_tokens);
        // The context bound first: it is the one a client can act on.
        for (limit, what) in [
            (self.max_model_len, "max_model_len"),
            (self.max_sequence_tokens, "the whole KV cache"),
        ] {
            if needed > limit {
                return Err(AdmissionError::NeverFits {
                    prompt_tokens,
                    max_tokens,
                    needed,
                    limit,
                    what,
                });
            }
        }
        Ok(())
    }

    /// Admit `req` or refuse it. On success the request has an id, a waiting slot and a
    /// fresh event channel whose receiver goes to the caller.
    pub fn admit(
        self: &Arc<Self>,
        request: GenerationRequest,
    ) -> Result<(AdmittedRequest, TokenReceiver), AdmissionError> {
        if self.is_closed() {
            return Err(AdmissionError::ShuttingDown);
        }
        self.check_fits(&request)?;
        let permit = self.reserve_slot()?;
        let id = SeqId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (sender, receiver) = token_channel(self.max_buffered_events, self.wake.get().cloned());
        Ok((
            AdmittedRequest {
                id,
                request,
                sender,
                permit,
                submitted: std::time::Instant::now(),
            },
            receiver,
        ))
    }

    fn reserve_slot(self: &Arc<Self>) -> Result<QueuePermit, AdmissionError> {
        let max_waiting = self.max_waiting;
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_waiting).then_some(n + 1)
            })
            .map_err(|waiting| AdmissionError::QueueFull {
                waiting,
                max_waiting,
            })?;
        Ok(QueuePermit {
            admission: Arc::clone(self),
        })
    }
}
