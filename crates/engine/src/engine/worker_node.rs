//! A worker node's loop: steps come from the leader's connection and run on this
//! node's ranks through the engine's own dispatch (the same worker threads, jobs and
//! failure rules as ranks in the leader's process); each step's outcome goes back.
//!
//! The node answers the leader's pings (so the leader hears of a node that died or hung
//! while idle) and arms faults the leader's test hook sends for its ranks. It exits its
//! loop (and the process should exit) when the leader closes the connection, says
//! nothing for the step timeout (it pings an idle node every two seconds), sends
//! something that is not a step, ping or fault, or when the node's group failed.

use std::time::Instant;

use super::Engine;
use crate::cluster::remote::decode_fault;
use crate::cluster::step_wire::{decode_batch, encode_outcome, MAX_STEP_BYTES};
use crate::error::{EngineError, Result};
use crate::tp::wire::{self, Kind, WireError};

impl Engine {
    /// Whether this engine is a worker node of a group of nodes (it runs steps from its
    /// leader with [`Engine::serve_leader`]; it serves no requests of its own).
    pub fn is_worker_node(&self) -> bool {
        self.leader.is_some()
    }

    /// Runs the leader's steps until the leader goes away or the group fails; always
    /// ends with the reason.
    pub fn serve_leader(&mut self) -> Result<()> {
        let mut link = self.leader.take().ok_or_else(|| {
            EngineError::Parallel("this engine is not a worker node of a group".into())
        })?;
        let idle_limit = self.step_timeout;
        let node = link.node_rank;
        tracing::info!("node {node}: serving the leader's steps");
        loop {
            let frame = match wire::read_frame(
                &mut link.stream,
                MAX_STEP_BYTES,
                Instant::now() + idle_limit,
            ) {
                Ok(f) => f,
                Err(e) => {
                    let message = match e {
                        WireError::Closed => "the leader closed the connection".to_string(),
                        WireError::TimedOut => {
                            format!("no word from the leader within {idle_limit:?}")
                        }
                        other => format!("the leader's connection failed: {other}"),
                    };
                    return Err(EngineError::GroupFailed {
                        rank: None,
                        message,
                    });
                }
            };
            let batch = match frame.kind {
                Kind::Ping => {
                    let deadline = Instant::now() + idle_limit;
                    wire::write_frame(&mut link.stream, Kind::Pong, frame.seq, &[], deadline)
                        .map_err(|e| EngineError::GroupFailed {
                            rank: None,
                            message: format!("cannot answer the leader's ping: {e}"),
                        })?;
                    continue;
                }
                Kind::Inject => {
                    let (rank, fault) = decode_fault(&frame.payload).map_err(|message| {
                        EngineError::GroupFailed {
                            rank: None,
                            message,
                        }
                    })?;
                    tracing::warn!("node {node}: fault {fault:?} armed on rank {rank}");
                    self.inject_fault(rank, fault)?;
                    continue;
                }
                Kind::Step => decode_batch(&frame.payload),
                other => Err(format!("a {other:?} frame where a step belongs")),
            };
            let batch = batch.map_err(|message| EngineError::GroupFailed {
                rank: None,
                message,
            })?;
            let outcome = self.dispatch(batch).map(|_| ());
            let deadline = Instant::now() + idle_limit;
            let sent = wire::write_frame(
                &mut link.stream,
                Kind::StepResult,
                frame.seq,
                &encode_outcome(&outcome),
                deadline,
            );
            if let Err(e) = sent {
                return Err(EngineError::GroupFailed {
                    rank: None,
                    message: format!("cannot answer the leader: {e}"),
                });
            }
            if self.is_failed() {
                return Err(outcome.err().unwrap_or(EngineError::GroupFailed {
                    rank: None,
                    message: "this node's ranks failed".into(),
                }));
            }
        }
    }
}
