//! Rendezvous: the worker nodes of a group find the leader (node rank 0) over TCP and
//! prove that they will run the same model the same way before any weight is loaded.
//!
//! A worker connects to `--master-addr:--master-port` (retrying until its timeout: the
//! leader may start later) and sends `Join` with its node rank and [`NodeIdentity`]. The
//! leader compares the identity with its own field by field; a difference is answered
//! `Refused`, naming the field and both values, and the leader keeps waiting for a node
//! that agrees. A node that agrees gets `Welcome`: where the collectives' hub listens,
//! the group's token, and the NCCL unique id (for CUDA ranks; CPU ranks have none). The
//! connection then stays open and carries the step plans.
//!
//! Messages are JSON in [`Kind::Rendezvous`](crate::tp::wire::Kind) frames of at most
//! [`MAX_MESSAGE_BYTES`].

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::tp::wire::{self, Kind};

/// Version of the protocol between nodes (rendezvous, step plans, collectives). Nodes of
/// different versions refuse each other.
pub const PROTOCOL_VERSION: u32 = 2;

const MAX_MESSAGE_BYTES: usize = 64 << 10;

/// Everything the nodes of a group must agree on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeIdentity {
    pub protocol_version: u32,
    /// [`model_fingerprint`](crate::cluster::model_fingerprint) of the model file.
    pub model_fingerprint: String,
    pub architecture: String,
    /// Ranks in the whole group (`--tensor-parallel-size`).
    pub world_size: usize,
    pub nnodes: usize,
    /// Each rank's share (`--tensor-split`, equal by default), as written.
    pub split: Vec<String>,
    pub allreduce_dtype: String,
    /// `cpu` or `cuda`: every node's ranks are of one kind.
    pub device_kind: String,
    pub block_size_tokens: usize,
    pub kv_cache_bytes: usize,
    /// The context the model is served with (`--max-model-len`, else the model's): it
    /// sizes the RoPE tables and chooses LongRoPE's factors, which every rank must share.
    #[serde(default)]
    pub context_length: usize,
}

impl NodeIdentity {
    /// Every field in which `other` differs, as "SETTING differs: the leader has A, node
    /// N has B" joined by `; `, where SETTING is what a person sets: the flag
    /// (`--block-size`), or the model file.
    pub fn mismatch(&self, other: &NodeIdentity, other_rank: usize) -> Option<String> {
        let (serde_json::Value::Object(mine), serde_json::Value::Object(theirs)) = (
            serde_json::to_value(self).ok()?,
            serde_json::to_value(other).ok()?,
        ) else {
            return Some("the identities cannot be compared".into());
        };
        let differences: Vec<String> = mine
            .iter()
            .filter_map(|(field, value)| {
                let theirs = theirs.get(field).unwrap_or(&serde_json::Value::Null);
                (value != theirs).then(|| {
                    format!(
                        "{} differs: the leader has {value}, node {other_rank} has {theirs}",
                        setting(field)
                    )
                })
            })
            .collect();
        (!differences.is_empty()).then(|| differences.join("; "))
    }
}

/// The setting behind an identity field, as a person gives it: the flag, or what is
/// meant when no flag sets it.
fn setting(field: &str) -> &str {
    match field {
        "protocol_version" => "the Tessera version (its node protocol)",
        "model_fingerprint" => "--model (the file's contents)",
        "architecture" => "--model (the architecture)",
        "world_size" => "--tensor-parallel-size",
        "nnodes" => "--nnodes",
        "split" => "--tensor-split",
        "allreduce_dtype" => "--allreduce-dtype",
        "device_kind" => "--devices (cpu or cuda)",
        "block_size_tokens" => "--block-size",
        "kv_cache_bytes" => "--kv-cache-memory-mib (the KV cache in bytes)",
        "context_length" => "--max-model-len",
        other => other,
    }
}

/// What the leader hands an agreeing worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// Port of the collectives' hub, on the leader's address.
    pub comm_port: u16,
    /// Token of the collective group (see [`GroupToken`](crate::tp::GroupToken)).
    pub group_token: u64,
    /// The NCCL unique id of a CUDA group; `None` for CPU ranks.
    pub nccl_id: Option<Vec<u8>>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Message {
    Join {
        node_rank: usize,
        identity: NodeIdentity,
    },
    Welcome(Welcome),
    Refused {
        reason: String,
    },
}

fn send(s: &mut TcpStream, m: &Message, deadline: Instant) -> Result<()> {
    let bytes = serde_json::to_vec(m).map_err(|e| EngineError::Parallel(e.to_string()))?;
    wire::write_frame(s, Kind::Rendezvous, 0, &bytes, deadline)
        .map_err(|e| EngineError::Parallel(format!("rendezvous: {e}")))
}

fn receive(s: &mut TcpStream, deadline: Instant) -> Result<Message> {
    let bytes = wire::expect_frame(s, Kind::Rendezvous, 0, MAX_MESSAGE_BYTES, deadline)
        .map_err(|e| EngineError::Parallel(format!("rendezvous: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| EngineError::Parallel(format!("rendezvous: a message that is not one: {e}")))
}

/// The address the leader listens on for `--master-addr HOST`: the loopback interface
/// when HOST is a loopback address, every interface otherwise (HOST names the leader for
/// the workers, and may be a name the leader's own interfaces do not carry).
pub fn leader_bind_addr(master_addr: &str, port: u16) -> Result<SocketAddr> {
    let resolved = resolve(master_addr, port)?;
    Ok(if resolved.ip().is_loopback() {
        resolved
    } else {
        SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port)
    })
}

pub fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| EngineError::Parallel(format!("--master-addr {host}: {e}")))?
        .next()
        .ok_or_else(|| EngineError::Parallel(format!("--master-addr {host} resolves to nothing")))
}

/// The leader's side: waits up to `timeout` for nodes `1..nnodes` to join with an
/// identity equal to `identity`; returns their connections in node order.
pub fn accept_workers(
    listener: &TcpListener,
    identity: &NodeIdentity,
    welcome: &Welcome,
    timeout: Duration,
) -> Result<Vec<TcpStream>> {
    let nnodes = identity.nnodes;
    let deadline = Instant::now() + timeout;
    let mut nodes: Vec<Option<TcpStream>> = (1..nnodes).map(|_| None).collect();
    let mut missing = nnodes.saturating_sub(1);
    if missing == 0 {
        return Ok(Vec::new());
    }
    let mut refusals = Vec::new();
    let complete = wire::accept_until(listener, deadline, |mut s| {
        // Step plans and their answers are small frames, latency-bound.
        s.set_nodelay(true)?;
        // A joining node has a few seconds to say who it is, whatever the group's timeout.
        let hello_by = deadline.min(Instant::now() + Duration::from_secs(10));
        let (node_rank, theirs) = match receive(&mut s, hello_by) {
            Ok(Message::Join {
                node_rank,
                identity,
            }) => (node_rank, identity),
            Ok(_) | Err(_) => {
                tracing::warn!("rendezvous: a connection that did not join was dropped");
                return Ok(false);
            }
        };
        let refusal = if node_rank == 0 || node_rank >= nnodes {
            Some(format!(
                "node rank {node_rank} is not a worker of a group of {nnodes} nodes"
            ))
        } else if nodes[node_rank - 1].is_some() {
            Some(format!("node rank {node_rank} has joined already"))
        } else {
            identity.mismatch(&theirs, node_rank)
        };
        if let Some(reason) = refusal {
            tracing::error!("rendezvous: refused node {node_rank}: {reason}");
            let _ = send(
                &mut s,
                &Message::Refused {
                    reason: reason.clone(),
                },
                hello_by,
            );
            refusals.push(reason);
            return Ok(false);
        }
        if send(&mut s, &Message::Welcome(welcome.clone()), hello_by).is_err() {
            return Ok(false);
        }
        tracing::info!("rendezvous: node {node_rank} joined");
        nodes[node_rank - 1] = Some(s);
        missing -= 1;
        Ok(missing == 0)
    })?;
    if !complete {
        let absent: Vec<usize> = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_none())
            .map(|(i, _)| i + 1)
            .collect();
        let also = match refusals.last() {
            Some(r) => format!(" (last refusal: {r})"),
            None => String::new(),
        };
        return Err(EngineError::Parallel(format!(
            "rendezvous: nodes {absent:?} did not join within {timeout:?}{also}"
        )));
    }
    Ok(nodes.into_iter().flatten().collect())
}

/// A worker's side: joins the leader at `master`, retrying the connection until
/// `timeout`. Returns the open connection and the leader's welcome, or why not.
pub fn join(
    master: SocketAddr,
    node_rank: usize,
    identity: &NodeIdentity,
    timeout: Duration,
) -> Result<(TcpStream, Welcome)> {
    let deadline = Instant::now() + timeout;
    let mut last_error;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(
            &master,
            left.clamp(Duration::from_millis(1), Duration::from_secs(5)),
        ) {
            Ok(s) => break join_on(s, node_rank, identity, deadline),
            Err(e) => last_error = e,
        }
        if Instant::now() + Duration::from_millis(500) >= deadline {
            return Err(EngineError::Parallel(format!(
                "rendezvous: no leader at {master} within {timeout:?} ({last_error})"
            )));
        }
        // The leader may not be listening yet: try again shortly.
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn join_on(
    mut s: TcpStream,
    node_rank: usize,
    identity: &NodeIdentity,
    deadline: Instant,
) -> Result<(TcpStream, Welcome)> {
    s.set_nodelay(true)?;
    send(
        &mut s,
        &Message::Join {
            node_rank,
            identity: identity.clone(),
        },
        deadline,
    )?;
    match receive(&mut s, deadline)? {
        Message::Welcome(w) => Ok((s, w)),
        Message::Refused { reason } => Err(EngineError::Parallel(format!(
            "the leader refused this node at rendezvous: {reason}"
        ))),
        Message::Join { .. } => Err(EngineError::Parallel(
            "rendezvous: the leader answered with a join".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> NodeIdentity {
        NodeIdentity {
            protocol_version: PROTOCOL_VERSION,
            model_fingerprint: "00112233aabbccdd".into(),
            architecture: "llama".into(),
            world_size: 4,
            nnodes: 3,
            split: vec!["1".into(); 4],
            allreduce_dtype: "f32".into(),
            device_kind: "cpu".into(),
            block_size_tokens: 16,
            kv_cache_bytes: 1 << 20,
            context_length: 2048,
        }
    }

    fn welcome() -> Welcome {
        Welcome {
            comm_port: 4242,
            group_token: 7,
            nccl_id: Some(vec![1, 2, 3]),
        }
    }

    #[test]
    fn agreeing_nodes_are_welcomed_and_a_mismatch_is_named() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let leader = std::thread::spawn(move || {
            accept_workers(&listener, &identity(), &welcome(), Duration::from_secs(20))
                .map(|v| v.len())
        });
        let mut other_model = identity();
        other_model.model_fingerprint = "ffffffffffffffff".into();
        let refused = join(addr, 1, &other_model, Duration::from_secs(10))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            refused.contains("--model (the file's contents) differs")
                && refused.contains("00112233aabbccdd")
                && refused.contains("ffffffffffffffff"),
            "{refused}"
        );
        let mut other_split = identity();
        other_split.split[0] = "3".into();
        let refused = join(addr, 2, &other_split, Duration::from_secs(10))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("--tensor-split differs"), "{refused}");
        let (_s1, w1) = join(addr, 1, &identity(), Duration::from_secs(10)).expect("node 1");
        let refused = join(addr, 1, &identity(), Duration::from_secs(10))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("joined already"), "{refused}");
        let (_s2, w2) = join(addr, 2, &identity(), Duration::from_secs(10)).expect("node 2");
        assert_eq!((w1, w2), (welcome(), welcome()));
        assert_eq!(leader.join().expect("leader").expect("accepted"), 2);
    }

    #[test]
    fn a_worker_waits_for_a_late_leader() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let worker =
            std::thread::spawn(move || join(addr, 1, &identity(), Duration::from_secs(20)));
        std::thread::sleep(Duration::from_millis(700));
        let listener = TcpListener::bind(addr).expect("rebind");
        let mut two = identity();
        two.nnodes = 2;
        // The worker says nnodes 3, this leader 2: the worker is refused, naming nnodes.
        let leader = std::thread::spawn(move || {
            accept_workers(&listener, &two, &welcome(), Duration::from_secs(2)).err()
        });
        let err = worker
            .join()
            .expect("worker")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--nnodes differs"), "{err}");
        let leader_err = leader
            .join()
            .expect("leader")
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            leader_err.contains("nodes [1] did not join"),
            "{leader_err}"
        );
        assert!(leader_err.contains("--nnodes differs"), "{leader_err}");
    }

    #[test]
    fn a_worker_without_a_leader_gives_up() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let err = join(addr, 1, &identity(), Duration::from_secs(1))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("no leader at"), "{err}");
    }
}
