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

/// Why a step failed. `rank` names the device worker that failed first, when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", rank.map(|r| format!("rank {r}: ")).unwrap_or_default())]
pub struct ExecutorError {
    pub rank: Option<usize>,
    pub message: String,
}

/// Runs planned steps. The engine implements it for real models; tests use fakes.
pub trait Executor: Send {
    /// Run one step. Blocks until every device has finished it.
    fn step(&mut self, plan: &crate::StepPlan) -> Result<crate::StepOutput, ExecutorError>;

    /// The KV cache this executor owns.
    fn kv_cache_shape(&self) -> KvCacheShape;

    /// Longest context the model supports, in tokens.
    fn max_context_tokens(&self) -> usize;

    /// Whether the executor can run no more steps (a device rank failed or hung and
    /// its group is aborted). Asked after a failed step: the loop then fails every
    /// request and stops instead of retrying. Executors whose errors are always
    /// transient keep the default.
    fn is_failed(&self) -> bool {
        false
    }
}
