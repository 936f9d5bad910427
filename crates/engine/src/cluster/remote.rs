//! The leader's stand-in for a worker node: a [`WorkerHandle`] like any local rank's,
//! whose thread forwards each job over the node's connection and hands back the node's
//! answer. The engine's step loop sends to it and waits on it exactly as on a local
//! worker, so its timeouts and failure rules cover remote ranks unchanged.
//!
//! While no step is running the thread pings the node every [`PING_INTERVAL`], so an
//! idle node knows its leader is alive (and exits when it goes quiet).

use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use crate::cluster::step_wire::{decode_outcome, encode_batch};
use crate::error::{EngineError, Result};
use crate::tp::wire::{self, Kind, WireError};
use crate::worker::{Job, StepResult, WorkerHandle};

pub(crate) const PING_INTERVAL: Duration = Duration::from_secs(2);

/// Outcomes are small: a message at most.
const MAX_OUTCOME_BYTES: usize = 64 << 10;

/// Starts the stand-in of node `node_rank`, whose first rank is `first_rank`.
pub(crate) fn spawn(
    stream: TcpStream,
    node_rank: usize,
    first_rank: usize,
    step_timeout: Duration,
) -> Result<WorkerHandle> {
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<Job>();
    let (res_tx, res_rx) = crossbeam_channel::unbounded::<StepResult>();
    let thread = std::thread::Builder::new()
        .name(format!("tessera-node{node_rank}"))
        .spawn(move || {
            let mut link = Link {
                stream,
                node_rank,
                first_rank,
                step_timeout,
                broken: None,
                seq: 0,
            };
            loop {
                match job_rx.recv_timeout(PING_INTERVAL) {
                    Ok(job) => {
                        if let Some(answer) = link.forward(job) {
                            if res_tx.send(answer).is_err() {
                                break;
                            }
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => link.ping(),
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            // The engine is gone: closing the connection tells the node to exit.
            let _ = link.stream.shutdown(Shutdown::Both);
        })
        .map_err(|e| EngineError::GroupFailed {
            rank: Some(first_rank),
            message: format!("cannot start the link to node {node_rank}: {e}"),
        })?;
    Ok(WorkerHandle {
        rank: first_rank,
        jobs: job_tx,
        results: res_rx,
        thread: Some(thread),
    })
}

struct Link {
    stream: TcpStream,
    node_rank: usize,
    first_rank: usize,
    step_timeout: Duration,
    /// Why the connection is unusable, once it is.
    broken: Option<String>,
    seq: u64,
}

impl Link {
    fn failure(&self, message: String) -> EngineError {
        EngineError::GroupFailed {
            rank: Some(self.first_rank),
            message,
        }
    }

    fn lost(&mut self, during: &str, e: WireError) -> String {
        let why = match e {
            WireError::Closed => format!("node {} disconnected {during}", self.node_rank),
            WireError::TimedOut => format!(
                "node {} did not answer {during} within {:?}",
                self.node_rank, self.step_timeout
            ),
            other => format!("node {} {during}: {other}", self.node_rank),
        };
        let _ = self.stream.shutdown(Shutdown::Both);
        self.broken.get_or_insert(why).clone()
    }

    fn ping(&mut self) {
        if self.broken.is_some() {
            return;
        }
        let deadline = Instant::now() + PING_INTERVAL;
        if let Err(e) = wire::write_frame(&mut self.stream, Kind::Ping, self.seq, &[], deadline) {
            let why = self.lost("while idle", e);
            tracing::error!("{why}");
        }
    }

    /// The answer the engine expects for `job`, if it expects one.
    fn forward(&mut self, job: Job) -> Option<StepResult> {
        let batch = match job {
            Job::Step(batch) => batch,
            // Fault injection reaches local ranks only.
            Job::Inject(_) => return None,
            Job::Reconnect(_) => {
                return Some(Err(self.failure(
                    "a group spanning nodes is formed once, at rendezvous".into(),
                )))
            }
            Job::ResizeCache { .. } => {
                return Some(Err(
                    self.failure("a worker node sizes its cache at rendezvous".into())
                ))
            }
        };
        if let Some(why) = &self.broken {
            return Some(Err(self.failure(why.clone())));
        }
        self.seq += 1;
        let seq = self.seq;
        // A little longer than the engine waits, so the node's own report of a
        // collective timeout arrives before this link calls the node silent.
        let deadline = Instant::now() + self.step_timeout + Duration::from_secs(1);
        let sent = wire::write_frame(
            &mut self.stream,
            Kind::Step,
            seq,
            &encode_batch(&batch),
            deadline,
        );
        let answer = sent.and_then(|_| {
            wire::expect_frame(
                &mut self.stream,
                Kind::StepResult,
                seq,
                MAX_OUTCOME_BYTES,
                deadline,
            )
        });
        Some(match answer {
            Ok(bytes) => decode_outcome(&bytes).map(|_| None),
            Err(e) => {
                let why = self.lost("during a step", e);
                Err(self.failure(why))
            }
        })
    }
}
