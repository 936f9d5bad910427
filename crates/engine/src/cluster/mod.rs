//! Several nodes, one model: one Tessera process per node. The leader (node rank 0)
//! runs the scheduler and sends every step to the worker nodes; each node runs its own
//! ranks (`tensor-parallel-size / nnodes` of them), and the ranks of all nodes join the
//! same collectives. [`rendezvous`] checks that the nodes agree before anything loads.

pub mod fingerprint;
pub mod node_loss;
pub mod rendezvous;

use std::time::Duration;

pub use fingerprint::model_fingerprint;
pub use node_loss::NodeLoss;
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

pub(crate) mod placement;
pub(crate) mod remote;
pub(crate) mod step_wire;
pub(crate) mod worker_node;

pub(crate) use worker_node::LeaderLink;

/// A node's connections to the other nodes of its group.
pub(crate) enum NodeLinks {
    /// Every rank is in this process.
    Single,
    /// The leader's connection to each worker node, in node order.
    Leader(Vec<std::net::TcpStream>),
    /// A worker node's connection to its leader.
    Worker(LeaderLink),
}

/// What [`attach_nodes`] gives a node: a worker node's link to its leader, or the
/// leader's word of a node lost while idle.
#[derive(Default)]
pub(crate) struct Attached {
    pub leader: Option<LeaderLink>,
    pub node_loss: Option<NodeLoss>,
}

/// Adds a stand-in worker for each worker node to the leader's `workers`.
pub(crate) fn attach_nodes(
    links: NodeLinks,
    workers: &mut Vec<crate::worker::WorkerHandle>,
    plan: &crate::tp::ShardPlan,
    cfg: &crate::config::EngineConfig,
) -> crate::error::Result<Attached> {
    match links {
        NodeLinks::Single => Ok(Attached::default()),
        NodeLinks::Worker(link) => Ok(Attached {
            leader: Some(link),
            node_loss: None,
        }),
        NodeLinks::Leader(streams) => {
            let per_node = plan.world_size / (streams.len() + 1);
            let (alarm, node_loss) = NodeLoss::channel();
            for (i, stream) in streams.into_iter().enumerate() {
                let node = i + 1;
                workers.push(remote::spawn(
                    stream,
                    remote::NodeSpan {
                        node_rank: node,
                        first_rank: node * per_node,
                        ranks: per_node,
                    },
                    cfg.step_timeout,
                    alarm.clone(),
                )?);
            }
            Ok(Attached {
                leader: None,
                node_loss: Some(node_loss),
            })
        }
    }
}
