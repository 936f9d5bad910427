//! A group of nodes on CPU ranks, each node a thread of this test with its own engine,
//! joined over real sockets (rendezvous, TCP collectives, step plans): N nodes of k
//! ranks give bitwise the logits and tokens of TP = N·k in one engine.

mod common;

use std::net::TcpListener;
use std::thread::JoinHandle;
use std::time::Duration;

use common::*;
use tessera_engine::cluster::NodeTopology;
use tessera_engine::{generate, Engine, EngineConfig, GenerateOptions};
use tessera_protocol::SamplingParams;

fn config(path: &std::path::Path, local_ranks: usize) -> EngineConfig {
    let mut cfg = EngineConfig::new(path).with_cpu_ranks(local_ranks);
    cfg.kv_cache_bytes = 16 << 20;
    cfg.threads_per_rank = Some(1);
    cfg.step_timeout = Duration::from_secs(60);
    cfg
}

/// A free port for a rendezvous, below the ephemeral range (32768 and up on Linux): the
/// nodes' own listeners take ephemeral ports, and one of them may otherwise be handed the
/// rendezvous port before the leader binds it.
fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 4_000) as u16;
    (0..8_000u16)
        .map(|_| base + NEXT.fetch_add(7, std::sync::atomic::Ordering::Relaxed) % 8_000)
        .find(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range")
}

fn topology(nnodes: usize, node_rank: usize, port: u16) -> NodeTopology {
    NodeTopology {
        nnodes,
        node_rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        join_timeout: Duration::from_secs(60),
    }
}

/// The leader's engine, and the worker nodes' threads (each ends with the reason its
/// node stopped serving).
fn group(path: &std::path::Path, nnodes: usize, local: usize) -> (Engine, Vec<JoinHandle<String>>) {
    let port = free_port();
    let workers = (1..nnodes)
        .map(|node| {
            let mut cfg = config(path, local);
            cfg.nodes = Some(topology(nnodes, node, port));
            std::thread::spawn(move || match Engine::load(&cfg) {
                Ok(mut engine) => {
                    assert!(engine.is_worker_node());
                    engine
                        .serve_leader()
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                }
                Err(e) => format!("load failed: {e}"),
            })
        })
        .collect();
    let mut cfg = config(path, local);
    cfg.nodes = Some(topology(nnodes, 0, port));
    let leader = Engine::load(&cfg).expect("leader");
    assert!(!leader.is_worker_node());
    (leader, workers)
}

fn greedy(engine: &mut Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        stop_token_ids: Vec::new(),
        prefill_chunk: 0,
    };
    generate(engine, prompt, &opts, |_| {}).expect("generate")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check_group_equals_one_process(path: &std::path::Path, nnodes: usize, local: usize) {
    let prompt: Vec<u32> = (1..40).map(|i| (i * 37) % 200 + 3).collect();
    let mut single = Engine::load(&config(path, nnodes * local)).expect("one process");
    let want_logits = last_logits(&mut single, &prompt);
    let want_tokens = greedy(&mut single, &prompt, 12);
    drop(single);

    let (mut leader, workers) = group(path, nnodes, local);
    assert_eq!(leader.shard_plan().world_size, nnodes * local);
    let got_logits = last_logits(&mut leader, &prompt);
    assert!(
        bits(&got_logits) == bits(&want_logits),
        "{nnodes} nodes x {local}: logits differ from TP={} in one process (rel L2 {})",
        nnodes * local,
        rel_l2(&got_logits, &want_logits)
    );
    assert_eq!(greedy(&mut leader, &prompt, 12), want_tokens);
    // The leader going away ends every worker node.
    drop(leader);
    for w in workers {
        let why = w.join().expect("worker node");
        assert!(why.contains("the leader closed the connection"), "{why}");
    }
}

#[test]
fn dense_two_nodes_of_one_rank_are_bitwise_tp2() {
    check_group_equals_one_process(&fixtures().join("tiny-llama"), 2, 1);
}

#[test]
fn dense_two_nodes_of_two_ranks_are_bitwise_tp4() {
    check_group_equals_one_process(&fixtures().join("tiny-llama"), 2, 2);
}

#[test]
fn smollm2_two_nodes_of_one_rank_are_bitwise_tp2() {
    check_group_equals_one_process(&smollm2_path(), 2, 1);
}

#[test]
fn a_node_with_another_model_is_refused_naming_the_fingerprint() {
    let port = free_port();
    let leader = std::thread::spawn(move || {
        let mut cfg = config(&fixtures().join("tiny-llama"), 1);
        let mut topo = topology(2, 0, port);
        topo.join_timeout = Duration::from_secs(3);
        cfg.nodes = Some(topo);
        Engine::load(&cfg)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    });
    let mut cfg = config(&fixtures().join("tiny-qwen2"), 1);
    cfg.nodes = Some(topology(2, 1, port));
    let err = Engine::load(&cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("refused") && err.contains("--model (the file's contents) differs"),
        "{err}"
    );
    let leader_err = leader.join().expect("leader");
    assert!(
        leader_err.contains("nodes [1] did not join"),
        "{leader_err}"
    );
}
