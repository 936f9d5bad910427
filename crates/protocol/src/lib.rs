//! Contracts shared by all Tessera crates.
//!
//! This crate has no heavy dependencies: the scheduler, the engine and the server agree
//! on these types and nothing else. The scheduler plans a step ([`StepPlan`]), an
//! [`Executor`] (the engine, or a fake in tests) runs it and returns [`StepOutput`].

mod executor;
mod histogram;
mod pooling;
mod prepared;
mod sampling;
mod step;

pub use executor::{Executor, ExecutorError, FailureScope, KvCacheShape, KvGroups, RELEASED_BLOCK};
pub use histogram::{DurationHistogram, HistogramSnapshot};
pub use pooling::{Pooling, PoolingKind};
pub use prepared::PreparedConstraint;
pub use sampling::{
    FinishReason, GenerationRequest, OutputConstraint, SamplingParams, StopCondition,
    ThinkingBudget, ThinkingTags,
};
pub use step::{
    DraftTime, FailedSequence, NewSequence, SampledToken, ScheduledChunk, SeqId, StepOutput,
    StepPlan, TokenEvent, TokenLogprobs,
};
