//! Connections: the listener that bounds them (`--max-connections`, evicting idle ones
//! first), each connection's I/O with its header-read and keep-alive timeouts, the state
//! the request middleware marks requests in, and the kernel settings that keep a
//! non-reading client from parking a whole stream in socket buffers.

mod io;
mod listener;
pub mod parser_refusal;
mod sockets;
mod state;

pub use io::Connection;
pub use listener::{ConnHandle, LimitedListener};
pub use sockets::{fit_connections_to_open_files, NOT_SENT_LOW_WATER_BYTES};
pub use state::{
    ConnState, ConnTimeouts, RequestGuard, DEFAULT_HEADER_READ_TIMEOUT_SECS,
    DEFAULT_KEEP_ALIVE_TIMEOUT_SECS,
};
