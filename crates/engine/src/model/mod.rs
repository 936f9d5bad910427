//! Models and the pieces of their forward pass.

pub mod batch;
pub mod cpu_ops;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub mod cuda;
pub mod fast_math;
pub(crate) mod head_norms;
pub mod kv_cache;
pub mod linear;
pub mod linear_weight;
pub mod llama;
pub mod moe;
pub(crate) mod moe_routing;
pub mod paged_attention;
pub mod rope;
pub mod simd;
pub mod step_meta;

pub use batch::{Batch, BatchSeq, ChunkLimits};
pub use kv_cache::{CacheShape, KvCache, RankCache};
pub use llama::{load_rank_shards, load_shards, LlamaShard};
