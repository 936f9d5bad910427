//! A listener that holds at most `--max-connections` connections open. Each accepted
//! connection holds a slot (a semaphore permit) until hyper drops it. When every slot
//! is taken, the connection that has waited longest without a request in progress (a
//! silent socket, a head trickling in, an idle keep-alive) is closed and its slot given
//! to the new one, so sockets that send nothing cannot lock clients out. Only when every
//! slot serves a request is a connection answered 503 `too_many_connections` and closed,
//! by a short task with its own small limit (beyond which connections are closed at
//! once), so a flood of connections costs a bounded amount of memory.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::error::ServerError;
use crate::serve::connection::io::Connection;
use crate::serve::connection::parser_refusal::enveloped_close;
use crate::serve::connection::sockets::{self, MAX_REFUSALS_IN_FLIGHT};
use crate::serve::connection::state::{ConnState, ConnTimeouts};

/// How long a refusal may take (reading the request, writing the 503).
const REFUSAL_TIME: Duration = Duration::from_secs(2);
/// Least time between two warnings about failing accepts.
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(10);

pub struct LimitedListener {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
    refusal: Arc<[u8]>,
    timeouts: ConnTimeouts,
    /// Every connection handed to hyper that may still be open.
    open: Vec<Weak<ConnState>>,
    /// When accepting last failed with a warning, and failures since.
    accept_warned: Option<Instant>,
    accept_failures: u64,
}

impl LimitedListener {
    pub fn new(listener: TcpListener, max_connections: usize, timeouts: ConnTimeouts) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT)),
            refusal: enveloped_close(&ServerError::TooManyConnections).into(),
            timeouts,
            open: Vec::new(),
            accept_warned: None,
            accept_failures: 0,
        }
    }

    /// A slot for a new connection: a free one, or the one of the connection that has
    /// waited longest without a request.
    fn slot(&mut self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Some(permit);
        }
        self.open.retain(|c| c.strong_count() > 0);
        let mut waiting: Vec<(Instant, Arc<ConnState>)> = self
            .open
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|c| c.waiting_since().map(|since| (since, c)))
            .collect();
        waiting.sort_by_key(|(since, _)| *since);
        let permit = waiting.iter().find_map(|(_, c)| c.evict())?;
        tracing::debug!("connection limit reached: closed the longest-waiting idle connection");
        Some(permit)
    }

    fn refuse(&self, mut stream: TcpStream) {
        let Ok(permit) = Arc::clone(&self.refusals).try_acquire_owned() else {
            return;
        };
        let bytes = Arc::clone(&self.refusal);
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(REFUSAL_TIME, async move {
                // Read the request head first: closing with unread data resets the
                // connection, and the client could lose the response.
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") && seen.len() < 64 << 10 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                stream.write_all(&bytes).await?;
                stream.shutdown().await?;
                // Drain until the client closes, so the close is clean.
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                Ok::<_, io::Error>(())
            })
            .await;
        });
    }

    /// Out of file descriptors and the like: warn now and then, not at every attempt.
    fn accept_failed(&mut self, e: &io::Error) {
        self.accept_failures += 1;
        let due = self
            .accept_warned
            .is_none_or(|at| at.elapsed() >= ACCEPT_WARNING_EVERY);
        if due {
            tracing::warn!(
                "accepting connections failed {} time(s) since the last warning: {e}",
                self.accept_failures
            );
            self.accept_warned = Some(Instant::now());
            self.accept_failures = 0;
        }
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    self.accept_failed(&e);
                    // Back off instead of spinning while the failure lasts.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.slot() {
                Some(permit) => {
                    sockets::tune(&stream);
                    let state = ConnState::new(permit);
                    self.open.push(Arc::downgrade(&state));
                    return (Connection::new(stream, state, self.timeouts), addr);
                }
                None => {
                    tracing::warn!("connection limit reached: refusing a connection");
                    self.refuse(stream);
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// The connection a request came on, as handlers and middleware see it.
#[derive(Debug, Clone)]
pub struct ConnHandle(pub Arc<ConnState>);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, LimitedListener>>
    for ConnHandle
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, LimitedListener>) -> Self {
        ConnHandle(Arc::clone(stream.io().state()))
    }
}
