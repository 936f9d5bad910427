//! A listener that holds at most `--max-connections` connections open. Each accepted
//! connection holds a permit until hyper drops it. Over the limit a connection is
//! answered with a 503 `too_many_connections` envelope and closed, by a short task
//! with its own small limit (beyond which connections are closed at once), so a flood
//! of connections costs a bounded amount of memory. A bare error response hyper writes
//! itself (a 431 for a request head it cannot parse) leaves in the OpenAI error
//! envelope ([`parser_refusal`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::error::ServerError;
use crate::serve::parser_refusal;

/// Refusals being written at once; more connections over the limit are just closed.
const MAX_REFUSALS_IN_FLIGHT: usize = 64;
/// How long a refusal may take (reading the request, writing the 503).
const REFUSAL_TIME: Duration = Duration::from_secs(2);

pub struct LimitedListener {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
    refusal: Arc<[u8]>,
}

impl LimitedListener {
    pub fn new(listener: TcpListener, max_connections: usize) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT)),
            refusal: refusal_bytes().into(),
        }
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
}

/// The HTTP/1.1 response sent to a connection over the limit.
fn refusal_bytes() -> Vec<u8> {
    let error = ServerError::TooManyConnections;
    let status = error.status();
    let body = serde_json::to_string(&error.body()).unwrap_or_else(|_| "{}".to_string());
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match Arc::clone(&self.permits).try_acquire_owned() {
                Ok(permit) => {
                    let _ = stream.set_nodelay(true);
                    return (
                        LimitedConnection {
                            stream,
                            _permit: permit,
                            replacing: None,
                        },
                        addr,
                    );
                }
                Err(_) => {
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

/// A connection that frees its slot when dropped.
pub struct LimitedConnection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// A replacement response being written, with the bytes of it written so far and
    /// the length of what hyper asked to write (reported written once it is out).
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl LimitedConnection {
    /// Writes the replacement for hyper's `asked` bytes, if one is under way or `head`
    /// calls for one; `None` when `head` goes out as it is.
    fn poll_replacement(
        &mut self,
        cx: &mut Context<'_>,
        head: impl FnOnce() -> Option<(Vec<u8>, usize)>,
    ) -> Option<Poll<io::Result<usize>>> {
        if self.replacing.is_none() {
            let (bytes, asked) = head()?;
            self.replacing = Some((bytes, 0, asked));
        }
        let (bytes, written, asked) = self.replacing.as_mut()?;
        while *written < bytes.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Some(Poll::Ready(Err(io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Pending => return Some(Poll::Pending),
            }
        }
        let asked = *asked;
        self.replacing = None;
        Some(Poll::Ready(Ok(asked)))
    }
}

impl AsyncRead for LimitedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let head = || parser_refusal::replacement(buf).map(|r| (r, buf.len()));
        if let Some(poll) = this.poll_replacement(cx, head) {
            return poll;
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let head = || {
            // A bare response is all head: only then is it worth joining the slices.
            let first = bufs.iter().find(|b| !b.is_empty())?;
            if !first.starts_with(b"HTTP/1.1 431 ") {
                return None;
            }
            let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            parser_refusal::replacement(&joined).map(|r| (r, joined.len()))
        };
        if let Some(poll) = this.poll_replacement(cx, head) {
            return poll;
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
