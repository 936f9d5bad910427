//! The one decoder of every family, as one tensor-parallel shard per rank. Features set
//! in the model's `ModelConfig`, not family names, choose its parts; each family's files
//! state them (`crate::families`).
//!
//! Per layer: RMSNorm → fused QKV (column-parallel) → (where the model has them, RMSNorms
//! of the queries and keys, per head or across all heads) → RoPE → paged attention over
//! this rank's heads → o_proj (row-parallel) → all-reduce → residual; RMSNorm → fused
//! gate/up (column-parallel) → act(gate)·up → down (row-parallel) → all-reduce →
//! residual. The embedding is mirrored (a lookup is cheaper than any collective); the LM
//! head is split by vocabulary and its logits are gathered. Features a family may add:
//! RMSNorms after attention and after the MLP (on the all-reduced sums, before each
//! residual add), scaled embeddings, a GELU MLP, sliding-window layers with their own
//! RoPE base, layers without RoPE, attention sinks, and in place of the dense MLP a
//! mixture of experts ([`crate::model::moe`]), joined by the same single all-reduce.
//!
//! [`DecoderShard`] (`shard`) is a rank's part, `load` reads it from the model's file,
//! and `forward` runs a step through its CPU half (`cpu`) or its CUDA half (`cuda`, with
//! `gpu_parts`).

mod cpu;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
mod cuda;
mod forward;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
mod gpu_parts;
mod load;
mod mtp;
mod pool;
mod shard;

pub use load::{load_rank_shards, load_shards, ShardParts};
pub use pool::Pooled;
pub use shard::DecoderShard;
