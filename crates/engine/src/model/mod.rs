//! The one decoder every family runs (`decoder`), its mixture of experts (`moe`), and the
//! pieces of the forward pass: batches and step metadata, attention over the paged KV
//! cache, linear layers and their weights, RoPE tables, the CPU kernels' callers
//! (`cpu_ops`) and the CUDA ranks' (`cuda`).

pub mod batch;
pub mod cpu_ops;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub mod cuda;
pub mod decoder;
pub mod fast_math;
pub(crate) mod head_norms;
pub mod kv_cache;
pub mod kv_groups;
pub mod kv_write;
pub mod linear;
pub mod linear_weight;
pub mod moe;
pub mod paged_attention;
pub mod rope;
pub mod simd;
pub mod step_meta;

pub use batch::{Batch, BatchSeq, ChunkLimits, GroupAddress};
pub use decoder::{load_rank_shards, load_shards, DecoderShard, ShardParts};
pub use kv_cache::{CacheShape, KvCache, RankCache};
