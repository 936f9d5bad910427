//! Frames on a TCP stream between Tessera processes: collectives, rendezvous and step
//! plans all speak them.
//!
//! A frame is a fixed 17-byte header — magic `TSR1`, a kind byte, a sequence number (u64)
//! and the payload length (u32), little-endian — then the payload. Nothing from the wire
//! is trusted: the magic and kind are checked, the length is checked against the caller's
//! bound before a byte of payload is read, and the payload is read in chunks that grow
//! the buffer only as data actually arrives (a peer that announces 4 GiB and sends
//! nothing costs a timeout, not an allocation). Every read and write runs under the
//! caller's deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub(crate) const MAGIC: [u8; 4] = *b"TSR1";
const HEADER_BYTES: usize = 17;
/// Payload bytes read per `read` call while a frame grows.
const CHUNK_BYTES: usize = 1 << 20;
/// Frames up to this size go out in one write.
const SMALL_FRAME_BYTES: usize = 64 << 10;

/// Frame kinds. One byte on the wire; an unknown byte is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Hello = 1,
    AllReduce = 2,
    AllGather = 3,
    Broadcast = 4,
    Barrier = 5,
    /// The sender gave up; the payload is its reason (UTF-8).
    Abort = 6,
    Rendezvous = 7,
    Step = 8,
    StepResult = 9,
    /// "Still here": the leader's word to an idle worker node.
    Ping = 10,
    /// A worker node's answer to a ping: it is alive and reading.
    Pong = 11,
    /// The leader arms a fault on one of a worker node's ranks (the fault-injection
    /// test hook); the payload is the rank (u32 LE) and the fault (one byte).
    Inject = 12,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::AllReduce,
            3 => Kind::AllGather,
            4 => Kind::Broadcast,
            5 => Kind::Barrier,
            6 => Kind::Abort,
            7 => Kind::Rendezvous,
            8 => Kind::Step,
            9 => Kind::StepResult,
            10 => Kind::Ping,
            11 => Kind::Pong,
            12 => Kind::Inject,
            _ => return None,
        })
    }
}

/// Why a frame could not be read or written. The caller adds who the peer was.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The peer closed the connection (or it was reset).
    Closed,
    /// The deadline passed.
    TimedOut,
    /// The peer sent something that is not a valid frame.
    Garbage(String),
    /// The peer aborted, with its reason.
    Aborted(String),
    Io(std::io::Error),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Closed => write!(f, "the connection was closed"),
            WireError::TimedOut => write!(f, "timed out"),
            WireError::Garbage(m) => write!(f, "invalid frame: {m}"),
            WireError::Aborted(m) => write!(f, "{m}"),
            WireError::Io(e) => write!(f, "{e}"),
        }
    }
}

fn classify(e: std::io::Error) -> WireError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => WireError::TimedOut,
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::NotConnected => WireError::Closed,
        _ => WireError::Io(e),
    }
}

fn remaining(deadline: Instant) -> Result<Duration, WireError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(WireError::TimedOut)
    } else {
        Ok(left)
    }
}

/// Fills `buf` before `deadline`.
fn read_full(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), WireError> {
    let mut done = 0;
    while done < buf.len() {
        s.set_read_timeout(Some(remaining(deadline)?))
            .map_err(WireError::Io)?;
        match s.read(&mut buf[done..]) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(classify(e)),
        }
    }
    Ok(())
}

/// One frame as read.
#[derive(Debug)]
pub(crate) struct Frame {
    pub kind: Kind,
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// Reads one frame whose payload is at most `max_len` bytes. An `Abort` frame becomes
/// [`WireError::Aborted`] (its reason is bounded to 4 KiB).
pub(crate) fn read_frame(
    s: &mut TcpStream,
    max_len: usize,
    deadline: Instant,
) -> Result<Frame, WireError> {
    let mut header = [0u8; HEADER_BYTES];
    read_full(s, &mut header, deadline)?;
    if header[..4] != MAGIC {
        return Err(WireError::Garbage(format!(
            "bad magic {:02x?}",
            &header[..4]
        )));
    }
    let kind = Kind::from_byte(header[4])
        .ok_or_else(|| WireError::Garbage(format!("unknown frame kind {}", header[4])))?;
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&header[5..13]);
    let mut len = [0u8; 4];
    len.copy_from_slice(&header[13..17]);
    let len = u32::from_le_bytes(len) as usize;
    let bound = if kind == Kind::Abort { 4096 } else { max_len };
    if len > bound {
        return Err(WireError::Garbage(format!(
            "a {kind:?} frame of {len} bytes, above the {bound} expected"
        )));
    }
    let mut payload = Vec::with_capacity(len.min(CHUNK_BYTES));
    while payload.len() < len {
        let start = payload.len();
        let take = (len - start).min(CHUNK_BYTES);
        payload.resize(start + take, 0);
        read_full(s, &mut payload[start..], deadline)?;
    }
    if kind == Kind::Abort {
        return Err(WireError::Aborted(
            String::from_utf8_lossy(&payload).into_owned(),
        ));
    }
    Ok(Frame {
        kind,
        seq: u64::from_le_bytes(seq),
        payload,
    })
}

/// Writes one frame before `deadline`.
pub(crate) fn write_frame(
    s: &mut TcpStream,
    kind: Kind,
    seq: u64,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), WireError> {
    let len = u32::try_from(payload.len())
        .map_err(|_| WireError::Garbage(format!("a payload of {} bytes", payload.len())))?;
    let mut header = [0u8; HEADER_BYTES];
    header[..4].copy_from_slice(&MAGIC);
    header[4] = kind as u8;
    header[5..13].copy_from_slice(&seq.to_le_bytes());
    header[13..17].copy_from_slice(&len.to_le_bytes());
    s.set_write_timeout(Some(remaining(deadline)?))
        .map_err(WireError::Io)?;
    if payload.len() <= SMALL_FRAME_BYTES {
        // One write: a header sent apart from its payload waits out the peer's delayed
        // acknowledgement when Nagle's algorithm is on (40 ms a frame on Linux).
        let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
        frame.extend_from_slice(&header);
        frame.extend_from_slice(payload);
        return s.write_all(&frame).map_err(classify);
    }
    s.write_all(&header).map_err(classify)?;
    for chunk in payload.chunks(CHUNK_BYTES) {
        s.set_write_timeout(Some(remaining(deadline)?))
            .map_err(WireError::Io)?;
        s.write_all(chunk).map_err(classify)?;
    }
    Ok(())
}

/// Reads a frame that must be of `kind` with sequence `seq`.
pub(crate) fn expect_frame(
    s: &mut TcpStream,
    kind: Kind,
    seq: u64,
    max_len: usize,
    deadline: Instant,
) -> Result<Vec<u8>, WireError> {
    let f = read_frame(s, max_len, deadline)?;
    if f.kind != kind || f.seq != seq {
        return Err(WireError::Garbage(format!(
            "expected {kind:?} #{seq}, got {:?} #{}",
            f.kind, f.seq
        )));
    }
    Ok(f.payload)
}

/// Accepts connections on `listener` until `take` says it has all it needs or `deadline`
/// passes (then `Ok(false)`). A blocking accept has no timeout, so it runs on its own
/// thread and is woken by a connection to the listener when the wait ends.
pub(crate) fn accept_until(
    listener: &std::net::TcpListener,
    deadline: Instant,
    mut take: impl FnMut(TcpStream) -> Result<bool, std::io::Error>,
) -> Result<bool, std::io::Error> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let local = listener.local_addr()?;
    let acceptor_listener = listener.try_clone()?;
    let (tx, rx) = crossbeam_channel::unbounded::<std::io::Result<TcpStream>>();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let acceptor = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("tessera-accept".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if tx.send(acceptor_listener.accept().map(|(s, _)| s)).is_err() {
                        break;
                    }
                }
            })?
    };
    let outcome = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(s)) => match take(s) {
                Ok(true) => break Ok(true),
                Ok(false) => {}
                Err(e) => break Err(e),
            },
            Ok(Err(e)) => break Err(e),
            Err(_) => break Ok(false),
        }
    };
    stop.store(true, Ordering::SeqCst);
    let wake = if local.ip().is_unspecified() {
        std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), local.port())
    } else {
        local
    };
    let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    let _ = acceptor.join();
    outcome
}

/// Little-endian readers over a payload; every read is bounds-checked.
pub(crate) struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.data.len() {
            return Err(WireError::Garbage(format!(
                "payload ends {} bytes early",
                n - self.data.len()
            )));
        }
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        Ok(head)
    }

    pub fn u32(&mut self) -> Result<u32, WireError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    pub fn u64(&mut self) -> Result<u64, WireError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        (a, b)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn frames_round_trip() {
        let (mut a, mut b) = pair();
        let payload: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
        let writer = std::thread::spawn(move || {
            write_frame(&mut a, Kind::Step, 7, &payload, soon()).map(|_| payload)
        });
        let f = read_frame(&mut b, 4 << 20, soon()).expect("frame");
        let sent = writer.join().expect("thread").expect("write");
        assert_eq!((f.kind, f.seq), (Kind::Step, 7));
        assert_eq!(f.payload, sent);
    }

    #[test]
    fn a_length_above_the_bound_is_refused_before_reading() {
        let (mut a, mut b) = pair();
        let mut header = Vec::from(MAGIC);
        header.push(Kind::AllReduce as u8);
        header.extend(0u64.to_le_bytes());
        header.extend(u32::MAX.to_le_bytes());
        a.write_all(&header).expect("write");
        let err = read_frame(&mut b, 1024, soon()).expect_err("must fail");
        assert!(err.to_string().contains("above the 1024"), "{err}");
    }

    #[test]
    fn a_short_payload_times_out_and_garbage_is_named() {
        let (mut a, mut b) = pair();
        let mut header = Vec::from(MAGIC);
        header.push(Kind::Step as u8);
        header.extend(0u64.to_le_bytes());
        header.extend(1000u32.to_le_bytes());
        a.write_all(&header).expect("write");
        let err = read_frame(&mut b, 1 << 20, Instant::now() + Duration::from_millis(200))
            .expect_err("must fail");
        assert!(matches!(err, WireError::TimedOut), "{err}");

        let (mut a, mut b) = pair();
        a.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
        let err = read_frame(&mut b, 1 << 20, soon()).expect_err("must fail");
        assert!(err.to_string().contains("bad magic"), "{err}");

        let (a, mut b) = pair();
        drop(a);
        let err = read_frame(&mut b, 1 << 20, soon()).expect_err("must fail");
        assert!(matches!(err, WireError::Closed), "{err}");
    }
}
