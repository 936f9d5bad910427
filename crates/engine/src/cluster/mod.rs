//! Several nodes, one model: one Tessera process per node. The leader (node rank 0)
//! runs the scheduler and sends every step to the worker nodes; each node runs its own
//! ranks (`tensor-parallel-size / nnodes` of them), and the ranks of all nodes join the
//! same collectives. [`rendezvous`] checks that the nodes agree before anything loads.

pub mod fingerprint;
pub mod node_loss;
pub mod rendezvous;

pub use fingerprint::model_fingerprint;
pub use node_loss::NodeLoss;
pub use rendezvous::{NodeIdentity, Welcome, PROTOCOL_VERSION};
// Where the server and tests name a node's place: beside the rest of the engine's config.
pub use crate::config::NodeTopology;

pub(crate) mod links;
pub(crate) mod remote;
pub(crate) mod step_wire;
