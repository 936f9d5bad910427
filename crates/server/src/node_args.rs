//! Command-line options that place this process in a group of nodes serving one model
//! (the torchrun and vLLM names). Like every `serve` flag, each is also a
//! `TESSERA_<KEY>` variable and a config-file key (`nnodes`, `node_rank`, ...).

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use tessera_engine::cluster::NodeTopology;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = crate::help_headings::NODES)]
pub struct NodeArgs {
    /// Nodes (processes, one per machine) that serve the model together;
    /// --tensor-parallel-size is the ranks of all of them, each node runs an equal share.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,

    /// This node's place in the group: 0 is the leader (HTTP API and scheduler), the
    /// others are workers (their ranks only; HTTP probes /livez and /readyz on --port
    /// when it is given).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,

    /// The leader's address, as every node reaches it.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,

    /// The leader's rendezvous port (the collectives use a second port the leader
    /// picks and announces at rendezvous).
    #[arg(long, default_value_t = 29500)]
    pub master_port: u16,

    /// Seconds the leader waits for every worker node to join, and a worker node for
    /// its leader (to appear, and its ranks to connect).
    #[arg(long, default_value_t = 300)]
    pub node_join_timeout: u64,
}

impl NodeArgs {
    /// Whether this process is a worker node (not the leader) of a group of nodes.
    pub fn is_worker(&self) -> bool {
        self.nnodes > 1 && self.node_rank > 0
    }

    /// This node's ranks out of `tensor_parallel_size` for the whole group.
    pub fn local_ranks(&self, tensor_parallel_size: usize) -> Result<usize> {
        if self.nnodes == 0 {
            bail!("--nnodes must be at least 1");
        }
        if self.node_rank >= self.nnodes {
            bail!(
                "--node-rank {} is not a node of --nnodes {} (ranks are 0..{})",
                self.node_rank,
                self.nnodes,
                self.nnodes - 1
            );
        }
        if tensor_parallel_size == 0 || !tensor_parallel_size.is_multiple_of(self.nnodes) {
            bail!(
                "--tensor-parallel-size {tensor_parallel_size} does not divide over --nnodes {}: \
                 every node runs the same number of ranks",
                self.nnodes
            );
        }
        Ok(tensor_parallel_size / self.nnodes)
    }

    /// The engine's view, `None` for a single node.
    pub fn topology(&self) -> Option<NodeTopology> {
        (self.nnodes > 1).then(|| NodeTopology {
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            join_timeout: Duration::from_secs(self.node_join_timeout.max(1)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nnodes: usize, node_rank: usize) -> NodeArgs {
        NodeArgs {
            nnodes,
            node_rank,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            node_join_timeout: 5,
        }
    }

    #[test]
    fn ranks_divide_over_nodes_or_the_flags_are_refused() {
        assert_eq!(args(1, 0).local_ranks(3).ok(), Some(3));
        assert_eq!(args(2, 1).local_ranks(4).ok(), Some(2));
        let err = args(2, 0).local_ranks(3).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("does not divide")));
        let err = args(2, 2).local_ranks(4).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("--node-rank 2")));
        assert!(args(1, 0).topology().is_none());
        assert!(args(2, 1).is_worker() && !args(2, 0).is_worker());
        assert_eq!(args(2, 1).topology().map(|t| t.master_port), Some(29500));
    }
}
