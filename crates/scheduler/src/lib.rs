//! Continuous batching over a paged KV cache, generic over the `Executor` that runs
//! the model.
//!
//! - [`Scheduler`] owns every sequence and plans each step under a token budget;
//! - [`KvCacheManager`] hands out KV blocks (ref-counted, prefix-cached by block hash);
//! - [`Admission`] answers `submit` synchronously (queue full, request never fits);
//! - [`EngineLoop`] runs schedule → execute → update on its own thread behind a
//!   cloneable [`SchedulerHandle`].

pub mod admission;
pub mod block_manager;
pub mod block_pool;
pub mod config;
pub mod engine_loop;
pub mod error;
mod guesses;
pub mod loop_stats;
pub mod metrics;
pub mod prefix_hit;
pub mod scheduler;
mod sequence;
pub mod speculation;
mod speculation_policy;
pub use sequence::PROMPT_LOGPROBS_CHUNK;
pub mod token_channel;

pub use admission::{Admission, AdmittedRequest, QueuePermit};
pub use block_manager::{KvCacheManager, OutOfBlocks, PrefixHit};
pub use block_pool::{BlockHash, BlockId, BlockPool};
pub use config::{ResolvedConfig, SchedulerConfig};
pub use engine_loop::{EngineLoop, ExecutorLossNotifier, SchedulerHandle};
pub use error::{AdmissionError, SchedulerError};
pub use loop_stats::{LoopHealth, StepDurations, STEP_DURATION_BUCKETS_SECONDS};
pub use metrics::{SchedulerMetrics, SharedMetrics};
pub use scheduler::Scheduler;
pub use speculation::{
    DraftModelSpeculation, NgramSpeculation, Proposal, Speculation, SpeculationCounters,
};
pub use token_channel::{TokenReceiver, TryRecvError};
