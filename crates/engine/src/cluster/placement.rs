//! The placement of one node of a group of nodes: rendezvous first (nothing loads
//! until the nodes agree), then this node's slice of the group's ranks, each with a
//! TCP endpoint into the group's collectives (rank 0, on the leader, is their hub).

use std::net::{SocketAddr, TcpListener};

use crate::cluster::rendezvous::{self, NodeIdentity, Welcome, PROTOCOL_VERSION};
use crate::cluster::{model_fingerprint, NodeLinks, NodeTopology};
use crate::config::{EngineConfig, ModelConfig};
use crate::device::DeviceSpec;
use crate::error::{EngineError, Result};
use crate::loader::TensorSource;
use crate::model::load_rank_shards;
use crate::placement::{settle_uploads, CommGroups, Member, Placement};
use crate::tp::{Endpoint, GroupToken, PlanOptions, ShardPlan, TcpEndpoint};
use crate::worker::StageLinks;

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
        architecture: config.architecture.clone(),
        world_size: cfg.devices.len() * topo.nnodes,
        nnodes: topo.nnodes,
        split: ratios.iter().map(|r| r.to_string()).collect(),
        allreduce_dtype: format!("{:?}", cfg.allreduce_dtype).to_lowercase(),
        device_kind: "cpu".into(),
        block_size_tokens: cfg.block_size_tokens,
        kv_cache_bytes: cfg.kv_cache_bytes,
    })
}

fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    }
}

pub(crate) fn nodes(
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
    if cfg.devices.iter().any(|d| !matches!(d, DeviceSpec::Cpu(_))) {
        return Err(EngineError::Parallel(
            "ranks on GPUs across nodes need NCCL's multi-node bootstrap, which this build does not wire; \
             serve a group of nodes with CPU ranks"
                .into(),
        ));
    }
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
    let (endpoints, links): (Vec<TcpEndpoint>, NodeLinks) = if topo.is_leader() {
        let bind = rendezvous::leader_bind_addr(&topo.master_addr, topo.master_port)?;
        let listener = TcpListener::bind(bind).map_err(|e| {
            EngineError::Parallel(format!("cannot listen for the worker nodes on {bind}: {e}"))
        })?;
        let comm = TcpListener::bind(SocketAddr::new(bind.ip(), 0))?;
        let hub = loopback_if_unspecified(comm.local_addr()?);
        let token = GroupToken::random();
        let welcome = Welcome {
            comm_port: hub.port(),
            group_token: token.0,
            nccl_id: None,
        };
        tracing::info!(
            "rendezvous: waiting up to {join:?} for {} worker node(s) on {bind}",
            topo.nnodes - 1
        );
        let streams = rendezvous::accept_workers(&listener, &me, &welcome, join)?;
        let mut e = vec![TcpEndpoint::hub(comm, world, token, dtype, timeout)];
        e.extend((1..local).map(|r| TcpEndpoint::spoke(hub, r, world, token, dtype, timeout)));
        (e, NodeLinks::Leader(streams))
    } else {
        let master = rendezvous::resolve(&topo.master_addr, topo.master_port)?;
        tracing::info!(
            "rendezvous: joining the leader at {master} as node {}",
            topo.node_rank
        );
        let (stream, welcome) = rendezvous::join(master, topo.node_rank, &me, join)?;
        let hub = SocketAddr::new(master.ip(), welcome.comm_port);
        let token = GroupToken(welcome.group_token);
        let e = (first..first + local)
            .map(|r| TcpEndpoint::spoke(hub, r, world, token, dtype, timeout))
            .collect();
        (
            e,
            NodeLinks::Worker(crate::cluster::LeaderLink {
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
            // Ranks of other nodes may still be loading their weights.
            endpoint: Box::new(endpoint.with_connect_timeout(join)) as Box<dyn Endpoint>,
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
    })
}
