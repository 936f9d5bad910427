//! The leader's stand-in for a worker node: a [`WorkerHandle`] like any local rank's,
//! whose thread forwards each job over the node's connection and hands back the node's
//! answer. The engine's step loop sends to it and waits on it exactly as on a local
//! worker, so its timeouts and failure rules cover remote ranks unchanged.
//!
//! While no step is running the thread pings the node every [`PING_INTERVAL`] and expects
//! its answer within the step timeout: an idle node knows its leader is alive (and exits
//! when it goes quiet), and the leader hears of a node that died or hung while idle
//! ([`super::NodeLoss`]) instead of at the next request.

use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, Sender};

use crate::cluster::step_wire::{decode_outcome, encode_batch};
use crate::error::{EngineError, Result};
use crate::tp::wire::{self, Kind, WireError};
use crate::worker::{Fault, Job, StepResult, WorkerHandle};

pub(crate) const PING_INTERVAL: Duration = Duration::from_secs(2);

/// Outcomes are small: a message at most.
const MAX_OUTCOME_BYTES: usize = 64 << 10;

/// Which ranks a worker node runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeSpan {
    pub node_rank: usize,
    pub first_rank: usize,
    pub ranks: usize,
}

/// Starts the stand-in of a worker node; `alarm` hears of the node lost while idle.
pub(crate) fn spawn(
    stream: TcpStream,
    span: NodeSpan,
    step_timeout: Duration,
    alarm: Sender<String>,
) -> Result<WorkerHandle> {
    let NodeSpan {
        node_rank,
        first_rank,
        ranks,
    } = span;
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
                alarm,
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
        span: ranks,
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
    /// Where a loss found while idle is reported.
    alarm: Sender<String>,
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

    /// Pings the node and waits for its answer, at most the step timeout.
    fn ping(&mut self) {
        if self.broken.is_some() {
            return;
        }
        let deadline = Instant::now() + self.step_timeout;
        let answered = wire::write_frame(&mut self.stream, Kind::Ping, self.seq, &[], deadline)
            .and_then(|_| wire::expect_frame(&mut self.stream, Kind::Pong, self.seq, 0, deadline));
        if let Err(e) = answered {
            let why = self.lost("while idle", e);
            tracing::error!("{why}");
            // The receiver is gone only when the engine is.
            let _ = self.alarm.send(why);
        }
    }

    /// Sends a fault to arm on one of the node's ranks ahead of its next step.
    fn inject(&mut self, rank: usize, fault: Fault) {
        if self.broken.is_some() {
            return;
        }
        let payload = encode_fault(rank, fault);
        let deadline = Instant::now() + self.step_timeout;
        if let Err(e) =
            wire::write_frame(&mut self.stream, Kind::Inject, self.seq, &payload, deadline)
        {
            let why = self.lost("while arming a fault", e);
            tracing::error!("{why}");
        }
    }

    /// The answer the engine expects for `job`, if it expects one.
    fn forward(&mut self, job: Job) -> Option<StepResult> {
        let batch = match job {
            Job::Step(batch) => batch,
            Job::Inject { rank, fault } => {
                self.inject(rank, fault);
                return None;
            }
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
            // Not sent: graphs are recorded on one node only.
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            Job::RecordGraphs(_) => {
                return Some(Err(EngineError::Config(
                    "decode graphs are recorded on one node only".into(),
                )))
            }
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            Job::DropGraphs => return None,
            // Refused at load: the MTP layer runs on one node.
            Job::Mtp(_) => {
                return Some(Err(
                    self.failure("the MTP layer does not run on a group of nodes".into())
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

/// An armed fault on the wire: the rank (u32 LE), then the fault's byte.
fn encode_fault(rank: usize, fault: Fault) -> Vec<u8> {
    let mut payload = u32::try_from(rank)
        .unwrap_or(u32::MAX)
        .to_le_bytes()
        .to_vec();
    payload.push(fault.to_byte());
    payload
}

/// The rank and fault of an `Inject` frame, or why it is not one.
pub(crate) fn decode_fault(payload: &[u8]) -> std::result::Result<(usize, Fault), String> {
    let [a, b, c, d, kind] = payload else {
        return Err(format!("an Inject frame of {} bytes, not 5", payload.len()));
    };
    let rank = u32::from_le_bytes([*a, *b, *c, *d]) as usize;
    let fault = Fault::from_byte(*kind).ok_or_else(|| format!("unknown fault {kind}"))?;
    Ok((rank, fault))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_cross_the_wire_unchanged_and_bad_frames_are_refused() {
        for fault in [Fault::Error, Fault::Panic, Fault::Hang, Fault::Device] {
            assert_eq!(decode_fault(&encode_fault(3, fault)), Ok((3, fault)));
        }
        assert!(decode_fault(&[1, 0, 0, 0]).is_err());
        assert!(decode_fault(&[1, 0, 0, 0, 9]).is_err());
        assert!(decode_fault(&[1, 0, 0, 0, 1, 1]).is_err());
    }
}
