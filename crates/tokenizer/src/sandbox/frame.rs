//! Frames between a server and its template sandboxes: a 4-byte little-endian length, then
//! that many bytes of JSON. Lengths are checked against a bound before anything is read,
//! and the server's reads run under a deadline, so a sandbox that hangs or writes garbage
//! costs one request, never a thread.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a frame could not be moved.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The deadline passed before the whole frame arrived.
    TimedOut,
    /// The other side closed its end (a sandbox that died).
    Closed,
    /// Anything else: an I/O error, a length over the bound, malformed JSON.
    Broken(String),
}

type Result<T> = std::result::Result<T, FrameError>;

/// Largest frame either side accepts: a request body is capped far below this (the
/// server's `--max-body-bytes`), and a reply is the rendered text, capped by the template
/// config.
pub(crate) const MAX_FRAME_BYTES: usize = 256 << 20;

/// Writes `message` as one frame.
pub(crate) fn write_frame<T: Serialize>(out: &mut impl Write, message: &T) -> Result<()> {
    let body = serde_json::to_vec(message).map_err(|e| sandbox_err(format!("encoding: {e}")))?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(sandbox_err(format!(
            "a message of {} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit",
            body.len()
        )));
    }
    let len = u32::try_from(body.len()).map_err(|_| sandbox_err("frame too long".to_string()))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    out.write_all(&frame)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => FrameError::Closed,
            _ => sandbox_err(format!("writing: {e}")),
        })
}

/// Reads one frame with blocking reads (the sandbox side: its server is trusted to write
/// whole frames, and when it goes away the read ends).
pub(crate) fn read_frame<T: DeserializeOwned>(input: &mut impl Read) -> Result<Option<T>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(sandbox_err(format!("reading: {e}"))),
    }
    let len = checked_len(len)?;
    let mut body = vec![0u8; len];
    input
        .read_exact(&mut body)
        .map_err(|e| sandbox_err(format!("reading: {e}")))?;
    decode(&body).map(Some)
}

/// Reads one frame from `input`, failing once `deadline` passes (the server side).
pub(crate) fn read_frame_by<T: DeserializeOwned, R: Read + AsRawFd>(
    input: &mut R,
    deadline: Instant,
) -> Result<T> {
    let mut len = [0u8; 4];
    read_exact_by(input, &mut len, deadline)?;
    let len = checked_len(len)?;
    let mut body = vec![0u8; len];
    read_exact_by(input, &mut body, deadline)?;
    decode(&body)
}

fn checked_len(len: [u8; 4]) -> Result<usize> {
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(sandbox_err(format!(
            "a frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"
        )));
    }
    Ok(len)
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| sandbox_err(format!("a malformed message: {e}")))
}

/// Fills `buf`, waiting for data with `poll` so that no read blocks past `deadline`.
fn read_exact_by<R: Read + AsRawFd>(
    input: &mut R,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(FrameError::TimedOut);
        }
        let mut fd = libc::pollfd {
            fd: input.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fd` is one valid pollfd that lives across the call; count 1 matches.
        let ready = unsafe { libc::poll(&mut fd, 1, millis) };
        if ready < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(sandbox_err(format!("waiting for the sandbox: {err}")));
        }
        if ready == 0 {
            continue;
        }
        match input.read(&mut buf[filled..]) {
            Ok(0) => return Err(FrameError::Closed),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(sandbox_err(format!("reading: {e}"))),
        }
    }
    Ok(())
}

fn sandbox_err(message: String) -> FrameError {
    FrameError::Broken(message)
}
