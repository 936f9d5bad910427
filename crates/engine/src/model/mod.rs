//! Models and the pieces of their forward pass.

pub mod batch;
pub mod cpu_ops;
pub mod fast_math;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod paged_attention;
pub mod rope;
pub mod simd;

pub use batch::{Batch, BatchSeq};
pub use kv_cache::KvCache;
pub use llama::{load_shards, LlamaShard};
