//! What the server knows of each open connection: whether it is waiting for a request
//! head (and since when), busy with requests, or asked to close; shared by the
//! connection's I/O (which enforces the timeouts), the listener (which evicts idle
//! connections when every slot is taken) and the request middleware (which marks
//! requests started and, when their responses end, finished).

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

/// How long a connection may wait for a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnTimeouts {
    /// From accepting the connection (or from the first byte of a later request) until
    /// the whole request head has arrived; `None`: no limit.
    pub header_read: Option<Duration>,
    /// Between a response's end and the first byte of the next request on a kept-alive
    /// connection; `None`: no limit.
    pub keep_alive: Option<Duration>,
}

impl Default for ConnTimeouts {
    fn default() -> Self {
        Self {
            header_read: Some(Duration::from_secs(DEFAULT_HEADER_READ_TIMEOUT_SECS)),
            keep_alive: Some(Duration::from_secs(DEFAULT_KEEP_ALIVE_TIMEOUT_SECS)),
        }
    }
}

/// `--header-read-timeout` when none is given.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 10;
/// `--keep-alive-timeout` when none is given: long enough for a client's next request
/// in a conversation, short enough that idle sockets give their slots back.
pub const DEFAULT_KEEP_ALIVE_TIMEOUT_SECS: u64 = 30;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accepted; nothing read yet.
    Fresh { since: Instant },
    /// Between requests on a kept-alive connection; nothing of the next read yet.
    Idle { since: Instant },
    /// Part of a request head has arrived; the header timeout runs from `since`.
    Head { since: Instant },
    /// Serving requests (HTTP/2 may serve several at once).
    Busy { requests: usize },
}

/// What the connection's reader must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadRule {
    /// Read; give up at this instant, with this reason, if nothing completes before.
    Until(Instant, Expiry),
    /// Read without a deadline.
    Freely,
    /// Stop reading: the connection is to close.
    Close,
}

/// Why a connection's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// A request head started but did not finish in time: answer 408, then close.
    HeadTimedOut,
    /// Nothing arrived in time: close quietly.
    Idle,
}

#[derive(Debug)]
struct Inner {
    phase: Phase,
    /// The reader waiting for bytes, woken when the phase changes or the connection is
    /// evicted.
    reader: Option<Waker>,
    evicted: bool,
    /// The connection's slot under `--max-connections`; taken by an eviction.
    permit: Option<OwnedSemaphorePermit>,
}

/// One connection's state.
#[derive(Debug)]
pub struct ConnState {
    inner: Mutex<Inner>,
}

impl ConnState {
    pub(super) fn new(permit: OwnedSemaphorePermit) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                phase: Phase::Fresh {
                    since: Instant::now(),
                },
                reader: None,
                evicted: false,
                permit: Some(permit),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock; a poisoned state is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes arrived: a request head has started, unless one is being served.
    pub(super) fn bytes_read(&self) {
        let mut inner = self.lock();
        inner.phase = match inner.phase {
            // The first request's head is timed from the accept.
            Phase::Fresh { since } => Phase::Head { since },
            Phase::Idle { .. } => Phase::Head {
                since: Instant::now(),
            },
            other => other,
        };
    }

    /// What the reader must do, and registers `waker` to hear of changes.
    pub(super) fn read_rule(&self, timeouts: &ConnTimeouts, waker: &Waker) -> ReadRule {
        let mut inner = self.lock();
        if inner.evicted && !matches!(inner.phase, Phase::Busy { .. }) {
            return ReadRule::Close;
        }
        match &mut inner.reader {
            Some(w) if w.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
        let until = |since: Instant, limit: Option<Duration>, expiry| match limit {
            Some(limit) => ReadRule::Until(since + limit, expiry),
            None => ReadRule::Freely,
        };
        match inner.phase {
            Phase::Fresh { since } => until(since, timeouts.header_read, Expiry::Idle),
            Phase::Idle { since } => until(since, timeouts.keep_alive, Expiry::Idle),
            Phase::Head { since } => until(since, timeouts.header_read, Expiry::HeadTimedOut),
            Phase::Busy { .. } => ReadRule::Freely,
        }
    }

    /// A request's head was read and its handling begins; the guard marks its end.
    pub fn request_started(self: &Arc<Self>) -> RequestGuard {
        let mut inner = self.lock();
        inner.phase = match inner.phase {
            Phase::Busy { requests } => Phase::Busy {
                requests: requests + 1,
            },
            _ => Phase::Busy { requests: 1 },
        };
        RequestGuard(Arc::clone(self))
    }

    fn request_ended(&self) {
        let mut inner = self.lock();
        if let Phase::Busy { requests } = inner.phase {
            inner.phase = match requests {
                0 | 1 => Phase::Idle {
                    since: Instant::now(),
                },
                n => Phase::Busy { requests: n - 1 },
            };
        }
        // The reader may now have a deadline (or be evicted).
        if let Some(reader) = inner.reader.take() {
            reader.wake();
        }
    }

    /// Since when the connection has waited with no request in progress; `None` while
    /// it serves one.
    pub(super) fn waiting_since(&self) -> Option<Instant> {
        let inner = self.lock();
        match inner.phase {
            _ if inner.evicted => None,
            Phase::Fresh { since } | Phase::Idle { since } | Phase::Head { since } => Some(since),
            Phase::Busy { .. } => None,
        }
    }

    /// Closes the connection if it is still waiting (no request in progress), handing
    /// over its slot.
    pub(super) fn evict(&self) -> Option<OwnedSemaphorePermit> {
        let mut inner = self.lock();
        if inner.evicted || matches!(inner.phase, Phase::Busy { .. }) {
            return None;
        }
        inner.evicted = true;
        if let Some(reader) = inner.reader.take() {
            reader.wake();
        }
        inner.permit.take()
    }
}

/// A request in progress on a connection; dropping it (when the response has been
/// written, or the request abandoned) starts the keep-alive wait.
#[derive(Debug)]
pub struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

#[cfg(test)]
mod tests {
    use std::task::Wake;

    use tokio::sync::Semaphore;

    use super::*;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn state() -> (Arc<ConnState>, Arc<Semaphore>) {
        let slots = Arc::new(Semaphore::new(1));
        let permit = Arc::clone(&slots).try_acquire_owned().expect("a slot");
        (ConnState::new(permit), slots)
    }

    #[test]
    fn the_wait_for_a_head_is_timed_and_a_busy_connection_is_not() {
        let (conn, _) = state();
        let t = ConnTimeouts {
            header_read: Some(Duration::from_secs(10)),
            keep_alive: Some(Duration::from_secs(30)),
        };
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(Arc::clone(&flag));
        assert!(matches!(
            conn.read_rule(&t, &waker),
            ReadRule::Until(_, Expiry::Idle)
        ));
        conn.bytes_read();
        assert!(matches!(
            conn.read_rule(&t, &waker),
            ReadRule::Until(_, Expiry::HeadTimedOut)
        ));
        let guard = conn.request_started();
        assert_eq!(conn.read_rule(&t, &waker), ReadRule::Freely);
        assert!(conn.waiting_since().is_none());
        drop(guard);
        assert!(
            flag.0.load(std::sync::atomic::Ordering::SeqCst),
            "reader woken"
        );
        match conn.read_rule(&t, &waker) {
            ReadRule::Until(at, Expiry::Idle) => {
                assert!(at > Instant::now() + Duration::from_secs(25));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_a_waiting_connection_is_evicted_and_its_slot_handed_over() {
        let (conn, slots) = state();
        let waker = Waker::from(Arc::new(Flag(false.into())));
        let guard = conn.request_started();
        assert!(conn.evict().is_none(), "a busy connection stays");
        drop(guard);
        let permit = conn.evict();
        assert!(permit.is_some());
        assert!(conn.evict().is_none(), "evicted once");
        assert_eq!(
            conn.read_rule(&ConnTimeouts::default(), &waker),
            ReadRule::Close
        );
        assert_eq!(
            slots.available_permits(),
            0,
            "the slot went with the permit"
        );
        drop(permit);
        assert_eq!(slots.available_permits(), 1);
    }
}
