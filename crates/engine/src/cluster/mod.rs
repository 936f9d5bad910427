//! Several nodes, one model: one Tessera process per node. The leader (node rank 0)
//! runs the scheduler and sends every step to the worker nodes; each node runs its own
//! ranks (`tensor-parallel-size / nnodes` of them), and the ranks of all nodes join the
//! same collectives. [`rendezvous`] checks that the nodes agree before anything loads.

pub mod fingerprint;
pub mod rendezvous;

use std::time::Duration;

pub use fingerprint::model_fingerprint;
pub use rendezvous::{NodeIdentity, Welcome, PROTOCOL_VERSION};

/// Where this process sits in a group of nodes (`--nnodes`, `--node-rank`,
/// `--master-addr`, `--master-port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTopology {
    pub nnodes: usize,
    pub node_rank: usize,
    /// The leader's host name or address, as the workers reach it.
    pub master_addr: String,
    /// The leader's rendezvous port.
    pub master_port: u16,
    /// How long the leader waits for every worker to join, and a worker for the leader.
    pub join_timeout: Duration,
}

impl NodeTopology {
    pub fn is_leader(&self) -> bool {
        self.node_rank == 0
    }
}
