//! The scheduler crate's one error enum, and the admission refusals it wraps.
//!
//! `AdmissionError` is what `submit` answers before any stream opens; the server maps
//! each variant to one HTTP status (see the variant docs). `SchedulerError` covers
//! configuration mistakes and broken executor contracts.

use tessera_protocol::SeqId;

/// Why a request was refused at the door. Every message states the numbers involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The waiting queue is at `max_waiting`: retry later (HTTP 429 or 503 with
    /// `Retry-After`).
    #[error("server busy: {waiting} requests already waiting (max_waiting = {max_waiting})")]
    QueueFull { waiting: usize, max_waiting: usize },
    /// The request can never run, whatever the load (HTTP 400). `what` names the limit.
    #[error(
        "request needs {needed} tokens ({prompt_tokens} prompt + {max_tokens} max_tokens) \
         but {what} is {limit} tokens"
    )]
    NeverFits {
        prompt_tokens: usize,
        max_tokens: usize,
        needed: usize,
        limit: usize,
        what: &'static str,
    },
    /// The request is malformed in a way validation should have caught (HTTP 400).
    #[error("invalid request: {0}")]
    Invalid(&'static str),
    /// The engine loop has stopped (HTTP 503).
    #[error("scheduler is shutting down")]
    ShuttingDown,
}

/// Errors of the scheduler as a whole (not per request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    #[error("invalid scheduler config: {0}")]
    InvalidConfig(String),
    /// The executor's `StepOutput` does not match the plan it was given.
    #[error("executor output does not match the plan: {0}")]
    OutputMismatch(String),
    #[error("sequence {0} is unknown to the scheduler")]
    UnknownSequence(SeqId),
    #[error("engine loop thread panicked")]
    LoopPanicked,
}
