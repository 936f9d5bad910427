//! One node of a group of nodes: its placement, rendezvous first (nothing loads until
//! the nodes agree), then this node's slice of the group's ranks, each with an endpoint
//! into the group's collectives: for CPU ranks over TCP (rank 0, on the leader, is their
//! hub), for CUDA ranks through NCCL, whose unique id the leader hands out at rendezvous.
//! Once loaded, the leader drives each worker node through a stand-in worker
//! ([`attach`]).

use std::net::{SocketAddr, TcpListener};

use super::placement::{settle_uploads, CommGroups, Member, Placement};
use crate::cluster::fingerprint::model_fingerprint;
use crate::cluster::links::{LeaderLink, NodeLinks};
use crate::cluster::node_loss::NodeLoss;
use crate::cluster::remote;
use crate::cluster::rendezvous::{self, NodeIdentity, Welcome, PROTOCOL_VERSION};
use crate::config::{EngineConfig, NodeTopology};
use crate::device::device_spec::DeviceSpec;
use crate::error::{EngineError, Result};
use crate::loader::source::TensorSource;
use crate::model::{load_rank_shards, ShardParts};
use crate::spec::model::ModelConfig;
use crate::tp::{AllReduceDtype, Endpoint, GroupToken, PlanOptions, ShardPlan, TcpEndpoint};
use crate::worker::{StageLinks, WorkerHandle};

/// What this node must agree on with the others.
fn identity(
    cfg: &EngineConfig,
    config: &ModelConfig,
    topo: &NodeTopology,
    ratios: &[f64],
) -> Result<NodeIdentity> {
    Ok(NodeIdentity {
        protocol_version: PROTOCOL_VERSION,
        model_fingerprint: model_fingerprint(&cfg.model_path)?,
        architecture: config.family.name.to_string(),
        world_size: cfg.devices.len() * topo.nnodes,
        nnodes: topo.nnodes,
        split: ratios.iter().map(|r| r.to_string()).collect(),
        allreduce_dtype: format!("{:?}", cfg.allreduce_dtype).to_lowercase(),
        device_kind: device_kind(&cfg.devices)?.into(),
        block_size_tokens: cfg.block_size_tokens,
        kv_cache_bytes: cfg.kv_cache_bytes,
        context_length: config.max_position_embeddings,
    })
}

/// Whether this node's ranks are CPU ranks or GPUs of their own: a group's collectives
/// run either over TCP or through NCCL, never both, and NCCL refuses two ranks on one
/// GPU, which the same-GPU communicator of one process cannot join across nodes.
fn device_kind(devices: &[DeviceSpec]) -> Result<&'static str> {
    if devices.iter().all(|d| matches!(d, DeviceSpec::Cpu(_))) {
        return Ok("cpu");
    }
    if !devices.iter().all(|d| matches!(d, DeviceSpec::Cuda(_))) {
        return Err(EngineError::Parallel(
            "a node of a group of nodes runs either CPU ranks or CUDA ranks, not both".into(),
        ));
    }
    if devices
        .iter()
        .enumerate()
        .any(|(i, d)| devices[..i].contains(d))
    {
        return Err(EngineError::Parallel(
            "across nodes each CUDA rank needs a GPU of its own (NCCL joins them); \
             list each GPU once in --devices"
                .into(),
        ));
    }
    Ok("cuda")
}

/// The NCCL unique id of a welcome, checked: exactly 128 bytes, present for CUDA ranks.
fn nccl_id(welcome: &Welcome) -> Result<[u8; 128]> {
    let bytes = welcome.nccl_id.as_deref().ok_or_else(|| {
        EngineError::Parallel("the leader sent no NCCL id: it does not run CUDA ranks".into())
    })?;
    <[u8; 128]>::try_from(bytes).map_err(|_| {
        EngineError::Parallel(format!(
            "the leader's NCCL id has {} bytes, not 128",
            bytes.len()
        ))
    })
}

/// The endpoints of this node's `ranks` in a CUDA group spanning nodes.
#[cfg(feature = "cuda")]
fn nccl_endpoints(
    id: &[u8; 128],
    ranks: std::ops::Range<usize>,
    world: usize,
    dtype: AllReduceDtype,
    timeout: std::time::Duration,
) -> Result<Vec<Box<dyn Endpoint>>> {
    Ok(
        crate::tp::NcclEndpoint::node_group(id, ranks, world, dtype, timeout)
            .into_iter()
            .map(|e| Box::new(e) as Box<dyn Endpoint>)
            .collect(),
    )
}

#[cfg(not(feature = "cuda"))]
fn nccl_endpoints(
    _id: &[u8; 128],
    _ranks: std::ops::Range<usize>,
    _world: usize,
    _dtype: AllReduceDtype,
    _timeout: std::time::Duration,
) -> Result<Vec<Box<dyn Endpoint>>> {
    Err(EngineError::Parallel(
        "CUDA ranks need a build with the `cuda` feature".into(),
    ))
}

#[cfg(feature = "cuda")]
fn new_nccl_id() -> Result<[u8; 128]> {
    crate::tp::NcclEndpoint::new_id_bytes()
}

#[cfg(not(feature = "cuda"))]
fn new_nccl_id() -> Result<[u8; 128]> {
    Err(EngineError::Parallel(
        "CUDA ranks need a build with the `cuda` feature".into(),
    ))
}

/// How the leader's ranks reach the rest of the group.
enum LeaderCollectives {
    /// NCCL's unique id, sent to every worker node.
    Nccl([u8; 128]),
    /// The TCP hub's listener, and the address the workers' ranks dial.
    Tcp(TcpListener, SocketAddr),
}

fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    }
}

/// This node's members of a group of `topo.nnodes` nodes.
pub(crate) fn place(
    source: &dyn TensorSource,
    cfg: &EngineConfig,
    config: &ModelConfig,
    input_block: usize,
    topo: &NodeTopology,
) -> Result<Placement> {
    if cfg.device_layers.is_some() {
        return Err(EngineError::Parallel(
            "--device-layers places whole layers in one process; it cannot be combined with --nnodes".into(),
        ));
    }
    let cuda = device_kind(&cfg.devices)? == "cuda";
    if topo.node_rank >= topo.nnodes {
        return Err(EngineError::Parallel(format!(
            "--node-rank {} is not a node of --nnodes {}",
            topo.node_rank, topo.nnodes
        )));
    }
    let local = cfg.devices.len();
    let world = local * topo.nnodes;
    let ratios = match &cfg.tensor_split {
        Some(r) if r.len() != world => {
            return Err(EngineError::Parallel(format!(
                "--tensor-split has {} ratios for {world} ranks; give one ratio per rank of the whole group",
                r.len()
            )))
        }
        Some(r) => r.clone(),
        None => vec![1.0; world],
    };
    let plan = ShardPlan::new(
        config,
        &PlanOptions {
            ratios: ratios.clone(),
            input_block,
        },
    )?;
    let me = identity(cfg, config, topo, &ratios)?;
    let first = topo.node_rank * local;
    let (dtype, timeout, join) = (cfg.allreduce_dtype, cfg.step_timeout, topo.join_timeout);
    let (endpoints, links): (Vec<Box<dyn Endpoint>>, NodeLinks) = if topo.is_leader() {
        let bind = rendezvous::leader_bind_addr(&topo.master_addr, topo.master_port)?;
        let listener = TcpListener::bind(bind).map_err(|e| {
            EngineError::Parallel(format!("cannot listen for the worker nodes on {bind}: {e}"))
        })?;
        let token = GroupToken::random();
        // A CUDA group all-reduces over NCCL (the id is all the workers need); a CPU
        // group over TCP, through a hub the leader listens for.
        let collectives = if cuda {
            LeaderCollectives::Nccl(new_nccl_id()?)
        } else {
            let comm = TcpListener::bind(SocketAddr::new(bind.ip(), 0))?;
            let hub = loopback_if_unspecified(comm.local_addr()?);
            LeaderCollectives::Tcp(comm, hub)
        };
        let (comm_port, nccl_id) = match &collectives {
            LeaderCollectives::Tcp(_, hub) => (hub.port(), None),
            LeaderCollectives::Nccl(id) => (0, Some(id.to_vec())),
        };
        let welcome = Welcome {
            comm_port,
            group_token: token.0,
            nccl_id,
        };
        tracing::info!(
            "rendezvous: waiting up to {join:?} for {} worker node(s) on {bind}",
            topo.nnodes - 1
        );
        let streams = rendezvous::accept_workers(&listener, &me, &welcome, join)?;
        let e = match collectives {
            LeaderCollectives::Nccl(id) => nccl_endpoints(&id, 0..local, world, dtype, timeout)?,
            LeaderCollectives::Tcp(comm, hub) => {
                let mut e = vec![tcp(
                    TcpEndpoint::hub(comm, world, token, dtype, timeout),
                    join,
                )];
                e.extend((1..local).map(|r| {
                    tcp(
                        TcpEndpoint::spoke(hub, r, world, token, dtype, timeout),
                        join,
                    )
                }));
                e
            }
        };
        (e, NodeLinks::Leader(streams))
    } else {
        let master = rendezvous::resolve(&topo.master_addr, topo.master_port)?;
        tracing::info!(
            "rendezvous: joining the leader at {master} as node {}",
            topo.node_rank
        );
        let (stream, welcome) = rendezvous::join(master, topo.node_rank, &me, join)?;
        let token = GroupToken(welcome.group_token);
        let e = if cuda {
            nccl_endpoints(
                &nccl_id(&welcome)?,
                first..first + local,
                world,
                dtype,
                timeout,
            )?
        } else {
            let hub = SocketAddr::new(master.ip(), welcome.comm_port);
            (first..first + local)
                .map(|r| {
                    tcp(
                        TcpEndpoint::spoke(hub, r, world, token, dtype, timeout),
                        join,
                    )
                })
                .collect()
        };
        (
            e,
            NodeLinks::Worker(LeaderLink {
                stream,
                node_rank: topo.node_rank,
            }),
        )
    };
    let devices = cfg
        .devices
        .iter()
        .map(|d| d.open())
        .collect::<Result<Vec<_>>>()?;
    for r in first..first + local {
        let s = &plan.ranks[r];
        tracing::info!(
            "rank {r} (node {}): query heads {:?}, KV heads {:?}, FFN columns {:?}, vocabulary {:?}",
            topo.node_rank,
            s.q_heads,
            s.kv_heads,
            s.ffn,
            s.vocab
        );
    }
    let shards = load_rank_shards(
        source,
        &plan,
        first..first + local,
        &devices,
        0..config.num_layers,
        &ShardParts {
            host_expert_layers: cfg.host_expert_layers.unwrap_or(0),
            ..ShardParts::WHOLE
        },
    )?;
    settle_uploads(&devices)?;
    let members = shards
        .into_iter()
        .zip(endpoints)
        .enumerate()
        .map(|(i, (shard, endpoint))| Member {
            device: cfg.devices[i],
            shard,
            layers: 0..config.num_layers,
            endpoint,
            links: StageLinks::default(),
            returns_logits: first + i == 0,
        })
        .collect();
    let kv_heads_max = plan.ranks.iter().map(|r| r.kv_heads.len()).max();
    Ok(Placement {
        plan,
        members,
        groups: CommGroups::spanning_nodes(cfg),
        first_rank: first,
        kv_heads_max,
        links,
        host_expert_layers: cfg.host_expert_layers.unwrap_or(0),
    })
}

/// What [`attach`] gives a node: a worker node's link to its leader, or the
/// leader's word of a node lost while idle.
#[derive(Default)]
pub(crate) struct Attached {
    pub leader: Option<LeaderLink>,
    pub node_loss: Option<NodeLoss>,
}

/// Adds a stand-in worker for each worker node to the leader's `workers`.
pub(crate) fn attach(
    links: NodeLinks,
    workers: &mut Vec<WorkerHandle>,
    plan: &ShardPlan,
    cfg: &EngineConfig,
) -> Result<Attached> {
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

/// A TCP endpoint that waits up to `join` for its peers: ranks of other nodes may still
/// be loading their weights.
fn tcp(endpoint: TcpEndpoint, join: std::time::Duration) -> Box<dyn Endpoint> {
    Box::new(endpoint.with_connect_timeout(join))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_runs_cpu_ranks_or_gpus_of_its_own() -> Result<()> {
        let kind = |s: &str| device_kind(&DeviceSpec::parse_list(s)?);
        assert_eq!(kind("cpu:0,cpu:1")?, "cpu");
        assert_eq!(kind("cuda:0,cuda:1")?, "cuda");
        let mixed = device_kind(&[DeviceSpec::Cpu(0), DeviceSpec::Cuda(0)])
            .err()
            .map(|e| e.to_string());
        assert!(mixed.is_some_and(|m| m.contains("not both")));
        let shared = kind("cuda:0,cuda:0").err().map(|e| e.to_string());
        assert!(shared.is_some_and(|m| m.contains("a GPU of its own")));
        Ok(())
    }

    #[test]
    fn the_nccl_id_from_the_wire_is_checked() {
        let welcome = |id: Option<Vec<u8>>| Welcome {
            comm_port: 1,
            group_token: 2,
            nccl_id: id,
        };
        assert_eq!(nccl_id(&welcome(Some(vec![7; 128]))).ok(), Some([7; 128]));
        let short = nccl_id(&welcome(Some(vec![7; 12])))
            .err()
            .map(|e| e.to_string());
        assert!(short.is_some_and(|m| m.contains("12 bytes")));
        let none = nccl_id(&welcome(None)).err().map(|e| e.to_string());
        assert!(none.is_some_and(|m| m.contains("no NCCL id")));
    }
}
