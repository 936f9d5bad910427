//! The KV cache of CPU ranks sized from the machine's free memory (`--cpu-kv-cache-utilization`,
//! no `--kv-cache-memory-mib`): never more than the scheduler's sequences can use, and
//! without the sizing, the fixed budget. A cache of gigabytes costs no resident memory
//! until sequences write into it.
//!
//! The tests read this process's resident memory, so they take turns ([`ONE_AT_A_TIME`]).

mod common;

use std::sync::Mutex;

use common::*;
use tessera_engine::device::dtype::{KvCacheDtype, KvCacheDtypeChoice};
use tessera_engine::device::host_memory::CpuKvSizing;
use tessera_engine::model::kv_cache::LayerCache;
use tessera_engine::model::{KvCache, RankCache};
use tessera_engine::{Engine, EngineConfig};
use tessera_kernels::kv_quant::E4m3;
use tessera_protocol::Executor;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// This process's resident memory (`VmRSS`), in bytes.
fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<usize>().ok())
        .expect("VmRSS")
        * 1024
}

/// 2 GiB of cache in each element type: allocating it raises the resident memory by
/// almost nothing, and writing one block's keys makes only their pages resident.
#[test]
fn a_large_cpu_cache_is_not_resident_until_written() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (layers, bs, nkv, hd) = (4, 16, 4, 64);
    for dtype in [
        KvCacheDtype::F32,
        KvCacheDtype::Bf16,
        KvCacheDtype::F16,
        KvCacheDtype::Fp8E4m3,
        KvCacheDtype::Int8,
    ] {
        let block = RankCache::block_bytes_of(dtype, layers, nkv, hd, bs);
        let blocks = 2 * GIB / block;
        let before = resident_bytes();
        let started = std::time::Instant::now();
        let mut cache = KvCache::new(dtype, layers, blocks, bs, nkv, hd).expect("allocate");
        let took = started.elapsed();
        let allocated = resident_bytes().saturating_sub(before);
        assert!(
            allocated < 16 * MIB,
            "{dtype}: a 2 GiB cache made {} MiB resident",
            allocated >> 20
        );
        assert!(took.as_secs_f64() < 1.0, "{dtype}: allocated in {took:?}");
        // One block of one layer's keys written: its pages (a huge page at most) only.
        let row = cache.key_row(blocks / 2, 0);
        let len = nkv * hd * bs;
        match &mut cache.layers[0] {
            LayerCache::F32(l) => l.k[row..row + len].fill(1.0),
            LayerCache::Bf16(l) => l.k[row..row + len].fill(half::bf16::ONE),
            LayerCache::F16(l) => l.k[row..row + len].fill(half::f16::ONE),
            LayerCache::Fp8(l) => l.k[row..row + len].fill(E4m3(0x38)),
            LayerCache::Int8(l) => l.k[row..row + len].fill(1),
        }
        let written = resident_bytes().saturating_sub(before);
        assert!(
            written < 16 * MIB,
            "{dtype}: one written block made {} MiB resident",
            written >> 20
        );
        drop(cache);
    }
}

/// Two sequences at SmolLM2's longest context (8192 positions) need 2 × 513 int8 blocks
/// of 16 tokens, about 190 MiB: any machine that runs the tests has that free, so the
/// cache is exactly what they can use, not the share of memory.
#[test]
fn a_cpu_cache_from_free_memory_holds_what_the_sequences_can_use() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let path = smollm2_path();
    let mut cfg = EngineConfig::new(&path);
    cfg.kv_cache_dtype = Some(KvCacheDtypeChoice::Fixed(KvCacheDtype::Int8));
    cfg.max_num_seqs = 2;
    cfg.cpu_kv_sizing = Some(CpuKvSizing {
        utilization: 1.0,
        reserve_bytes: 0,
    });
    let engine = Engine::load(&cfg).expect("load");
    let context = engine.model_config().max_position_embeddings;
    assert_eq!(context, 8192);
    let shape = engine.kv_cache_shape();
    assert_eq!(shape.num_blocks, 2 * (context / 16 + 1));
    drop(engine);

    // Without the sizing: the fixed budget of 8 MiB over one block's bytes.
    cfg.cpu_kv_sizing = None;
    cfg.kv_cache_bytes = 8 << 20;
    let engine = Engine::load(&cfg).expect("load");
    let config = engine.model_config();
    let block = RankCache::block_bytes_of(
        KvCacheDtype::Int8,
        config.num_layers,
        config.num_kv_heads,
        config.head_dim,
        16,
    );
    assert_eq!(engine.kv_cache_shape().num_blocks, (8 << 20) / block);
}

/// The server's default: half the free memory, 1 GiB kept, here for 16 sequences of 8192
/// f32 positions (about 5.8 GiB, less where less is free). The engine loads without
/// making the cache resident, and a prompt written into it makes its blocks resident,
/// not the rest.
#[test]
fn a_cpu_cache_of_gigabytes_loads_without_becoming_resident() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut cfg = EngineConfig::new(smollm2_path());
    cfg.max_num_seqs = 16;
    cfg.threads_per_rank = Some(1);
    cfg.cpu_kv_sizing = Some(CpuKvSizing {
        utilization: 0.5,
        reserve_bytes: GIB,
    });
    let before = resident_bytes();
    let mut engine = Engine::load(&cfg).expect("load");
    let loaded = resident_bytes().saturating_sub(before);
    let config = engine.model_config().clone();
    let block = RankCache::block_bytes_of(
        KvCacheDtype::F32,
        config.num_layers,
        config.num_kv_heads,
        config.head_dim,
        16,
    );
    let cache = engine.kv_cache_shape().num_blocks * block;
    assert!(
        cache >= 2 * GIB,
        "a cache of {} MiB: too little memory free to test",
        cache >> 20
    );
    // The weights and the engine's buffers, not the cache.
    assert!(
        loaded < 768 * MIB,
        "a {} MiB cache: {} MiB resident after load",
        cache >> 20,
        loaded >> 20
    );
    let prompt: Vec<u32> = (0..200).map(|i| 100 + i).collect();
    let logits = last_logits(&mut engine, &prompt);
    assert!(logits.iter().all(|x| x.is_finite()));
    let used = resident_bytes().saturating_sub(before);
    assert!(
        used < loaded + 512 * MIB,
        "a 200-token prompt made {} MiB resident",
        (used - loaded) >> 20
    );
}
