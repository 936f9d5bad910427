//! The boundary between the scheduler and whatever runs the model.

/// Shape of the paged KV cache an executor owns; the scheduler hands out its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheShape {
    pub num_blocks: usize,
    pub block_size_tokens: usize,
}

impl KvCacheShape {
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size_tokens
    }
}

/// How far a failed step reaches. Failures stay as small as their cause: a sequence the
/// executor cannot run is reported in [`crate::StepOutput::failed`] while the rest of
/// the step goes on; an error that spoils the step fails the sequences of that step;
/// only a lost device or a failed collective ends the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureScope {
    /// The step's sequences failed; the executor is consistent again and runs the next
    /// step (sequences not in the step, queued or running, are untouched).
    Step,
    /// A device failed, a collective failed or timed out, or a rank hung: the executor
    /// runs no more steps and every request fails.
    Group,
}

/// Why a step failed. `rank` names the device worker that failed first, when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", rank.map(|r| format!("rank {r}: ")).unwrap_or_default())]
pub struct ExecutorError {
    pub rank: Option<usize>,
    pub message: String,
    pub scope: FailureScope,
}

impl ExecutorError {
    /// A failure of this step only.
    pub fn step(rank: Option<usize>, message: impl Into<String>) -> Self {
        Self {
            rank,
            message: message.into(),
            scope: FailureScope::Step,
        }
    }

    /// A failure that ends the executor.
    pub fn group(rank: Option<usize>, message: impl Into<String>) -> Self {
        Self {
            rank,
            message: message.into(),
            scope: FailureScope::Group,
        }
    }
}

/// Runs planned steps. The engine implements it for real models; tests use fakes.
pub trait Executor: Send {
    /// Run one step. Blocks until every device has finished it. A sequence the executor
    /// refuses (its own input is at fault) goes into `StepOutput::failed`; an error says
    /// with its [`FailureScope`] whether the executor can go on.
    fn step(&mut self, plan: &crate::StepPlan) -> Result<crate::StepOutput, ExecutorError>;

    /// The KV cache this executor owns.
    fn kv_cache_shape(&self) -> KvCacheShape;

    /// Longest context the model supports, in tokens.
    fn max_context_tokens(&self) -> usize;
}
