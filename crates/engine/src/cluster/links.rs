//! A node's connections to the other nodes of its group, as rendezvous left them: the
//! leader's to each worker node, or a worker node's to its leader.

use std::net::TcpStream;

/// A node's connections to the other nodes of its group.
pub(crate) enum NodeLinks {
    /// Every rank is in this process.
    Single,
    /// The leader's connection to each worker node, in node order.
    Leader(Vec<TcpStream>),
    /// A worker node's connection to its leader.
    Worker(LeaderLink),
}

/// A worker node's connection to its leader.
pub(crate) struct LeaderLink {
    pub stream: TcpStream,
    pub node_rank: usize,
}
