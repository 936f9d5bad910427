//! The KV cache of CPU ranks sized from the machine's free memory (`--cpu-kv-cache-utilization`,
//! no `--kv-cache-memory-mib`): never more than the scheduler's sequences can use, and
//! without the sizing, the fixed budget.

mod common;

use common::*;
use tessera_engine::device::dtype::{KvCacheDtype, KvCacheDtypeChoice};
use tessera_engine::device::host_memory::CpuKvSizing;
use tessera_engine::model::RankCache;
use tessera_engine::{Engine, EngineConfig};
use tessera_protocol::Executor;

/// Two sequences at SmolLM2's longest context (8192 positions) need 2 × 513 int8 blocks
/// of 16 tokens, about 190 MiB: any machine that runs the tests has that free, so the
/// cache is exactly what they can use, not the share of memory.
#[test]
fn a_cpu_cache_from_free_memory_holds_what_the_sequences_can_use() {
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
