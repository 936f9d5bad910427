//! One accepted connection as hyper reads and writes it. Around the socket it enforces
//! the waits of [`ConnTimeouts`] (a request head not finished in time gets a 408 in the
//! error envelope, an idle connection is closed quietly), closes when evicted, and
//! swaps the bare error responses hyper writes itself for the same status in the
//! envelope ([`super::parser_refusal`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use crate::api::error::ServerError;
use crate::serve::connection::parser_refusal;
use crate::serve::connection::state::{ConnState, ConnTimeouts, Expiry, ReadRule};

/// A connection that frees its slot when dropped (with its [`ConnState`]).
pub struct Connection {
    stream: TcpStream,
    state: Arc<ConnState>,
    timeouts: ConnTimeouts,
    /// The deadline timer and the instant it is set for.
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    /// The connection speaks HTTP/2 (its first bytes were the preface): an HTTP/1 408
    /// would be garbage to it.
    http2: bool,
    seen_any: bool,
    /// A replacement response being written, with the bytes of it written so far and
    /// the length of what hyper asked to write (reported written once it is out).
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl Connection {
    pub(super) fn new(stream: TcpStream, state: Arc<ConnState>, timeouts: ConnTimeouts) -> Self {
        Self {
            stream,
            state,
            timeouts,
            timer: Box::pin(tokio::time::sleep_until(tokio::time::Instant::now())),
            armed: None,
            http2: false,
            seen_any: false,
            replacing: None,
        }
    }

    /// The state the middleware marks requests in.
    pub fn state(&self) -> &Arc<ConnState> {
        &self.state
    }

    /// Whether the deadline `rule` sets has passed (arming the timer for it if not).
    fn expired(&mut self, cx: &mut Context<'_>, at: Instant) -> bool {
        if self.armed != Some(at) {
            self.timer.as_mut().reset(at.into());
            self.armed = Some(at);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }

    /// Best effort, without waiting: a 408 for a head that did not arrive in time.
    fn send_head_timeout(&self) {
        if self.http2 {
            return;
        }
        let bytes = parser_refusal::enveloped_close(&ServerError::HeadTimeout {
            limit_secs: self.timeouts.header_read.map_or(0, |d| d.as_secs()),
        });
        let _ = self.stream.try_write(&bytes);
    }

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

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let rule = this.state.read_rule(&this.timeouts, cx.waker());
        if rule == ReadRule::Close {
            // End of stream: hyper closes the connection as if the client had.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if !new.is_empty() {
                    if !this.seen_any {
                        this.seen_any = true;
                        this.http2 = new.starts_with(b"PRI * HTTP/2");
                    }
                    this.state.bytes_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match rule {
                ReadRule::Until(at, expiry) if this.expired(cx, at) => match expiry {
                    Expiry::Idle => Poll::Ready(Ok(())),
                    Expiry::HeadTimedOut => {
                        this.send_head_timeout();
                        Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
                    }
                },
                _ => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Connection {
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
            if !parser_refusal::may_be_bare(first) {
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
