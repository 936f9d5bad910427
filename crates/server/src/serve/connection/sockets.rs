//! Per-process and per-socket settings: the open-file limit the connection limit must
//! fit under, and what the kernel may buffer for a client that does not read.

use std::os::fd::AsRawFd;

use tokio::net::TcpStream;

/// Unsent bytes the kernel may hold for one connection before a write waits: with this,
/// a client that stops reading stops a stream within its receive window plus this,
/// instead of the up to 4 MiB the kernel's send buffer grows to, and the stream's stall
/// timeout starts counting.
pub const NOT_SENT_LOW_WATER_BYTES: u32 = 16 << 10;

/// Refusals being written at once (each a file descriptor); more connections over the
/// limit are just closed.
pub const MAX_REFUSALS_IN_FLIGHT: usize = 64;

/// File descriptors kept for everything but connections: model files, the chat
/// template sandboxes, the runtime, logs, and the refusals written over the limit.
const RESERVED_FILES: u64 = 256 + MAX_REFUSALS_IN_FLIGHT as u64;

/// Sets what the kernel may buffer for `stream`, and no delay for small writes.
pub fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    #[cfg(target_os = "linux")]
    {
        let value = NOT_SENT_LOW_WATER_BYTES as libc::c_int;
        // SAFETY: `setsockopt` reads `size_of::<c_int>()` bytes from a live `c_int`, on
        // a descriptor `stream` owns for the duration of the call.
        let rc = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!("TCP_NOTSENT_LOWAT: {}", std::io::Error::last_os_error());
        }
    }
}

/// Raises the soft open-file limit to the hard one, and returns `max_connections`
/// capped so that connections, and what else the process opens, fit under it (with one
/// warning when it had to be capped).
pub fn fit_connections_to_open_files(max_connections: usize) -> usize {
    let Some(limit) = raise_open_file_limit() else {
        return max_connections;
    };
    let fits = limit.saturating_sub(RESERVED_FILES).max(1);
    if (max_connections as u64) <= fits {
        return max_connections;
    }
    let capped = usize::try_from(fits).unwrap_or(max_connections);
    tracing::warn!(
        "--max-connections {max_connections} does not fit the open-file limit of {limit} \
         (ulimit -n; {RESERVED_FILES} kept for other files): serving at most {capped} \
         connections"
    );
    capped
}

/// The soft open-file limit after raising it to the hard limit; `None` if unknown.
fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the live local `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `setrlimit` reads one `rlimit` from the live local `raised`.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::debug!(
                "open-file limit raised from {} to {}",
                lim.rlim_cur,
                lim.rlim_max
            );
            lim.rlim_cur = lim.rlim_max;
        }
    }
    // RLIM_INFINITY is u64::MAX: no cap.
    Some(lim.rlim_cur)
}
