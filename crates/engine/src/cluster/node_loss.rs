//! How the leader hears that a worker node was lost while no step ran: the node's
//! stand-in pings it every [`super::remote::PING_INTERVAL`] and expects an answer within
//! the step timeout; when it gets none, it says why here. A step would find out too, but
//! only when the next request came; the server listens here so that it fails at once.

use crossbeam_channel::{Receiver, Sender};

/// The leader's end: one message per lost node.
pub struct NodeLoss {
    rx: Receiver<String>,
}

impl NodeLoss {
    pub(crate) fn channel() -> (Sender<String>, NodeLoss) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (tx, NodeLoss { rx })
    }

    /// Blocks until a node is lost (its reason), or until the engine is gone (`None`).
    pub fn wait(&self) -> Option<String> {
        self.rx.recv().ok()
    }
}

impl std::fmt::Debug for NodeLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLoss").finish_non_exhaustive()
    }
}
