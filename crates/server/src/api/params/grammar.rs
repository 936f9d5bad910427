//! A request's structured-output constraint, compiled once before submission: within
//! the size and depth bounds, on a compile thread of its own (never the engine's), at
//! most a few at once, and within a time limit. Every choice of the request then starts
//! its own matcher from the one compilation.
//!
//! A compilation that outlives the time limit is refused (400: the format is too
//! complex) and keeps its slot until its thread ends, so compilations nobody waits for
//! can never pile up past the slots.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_engine::structured::{check_bounds, spawn_prepare, GrammarBounds};
use tessera_engine::GrammarCompiler;
use tessera_protocol::{OutputConstraint, PreparedConstraint, SamplingParams};
use tokio::sync::Semaphore;

use crate::api::error::ServerError;
use crate::api::params::response_format::constraint_error;

/// How constraints are compiled for this model.
#[derive(Debug, Clone)]
pub struct GrammarService {
    /// The compiler; `Err` says why this model has none.
    compiler: Result<Arc<GrammarCompiler>, String>,
    limits: GrammarLimits,
    /// Compilations running at once, waited-for or not.
    slots: Arc<Semaphore>,
}

/// The bounds a constraint must keep and the time its compilation may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrammarLimits {
    pub bounds: GrammarBounds,
    /// Longest wait for a compilation, a free compile slot included.
    pub compile_timeout: Duration,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        Self {
            bounds: GrammarBounds::default(),
            compile_timeout: Duration::from_secs(DEFAULT_COMPILE_TIMEOUT_SECS),
        }
    }
}

/// `--grammar-compile-timeout` when none is given. The largest schemas within the
/// default bounds compile in about 3 s here.
pub const DEFAULT_COMPILE_TIMEOUT_SECS: u64 = 10;

impl GrammarService {
    pub fn new(compiler: Result<Arc<GrammarCompiler>, String>, limits: GrammarLimits) -> Self {
        // Compilation is CPU-bound: one slot per core, at most four.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            compiler,
            limits,
            slots: Arc::new(Semaphore::new(cores.clamp(1, 4))),
        }
    }

    /// The compiler, when this model has one.
    pub fn compiler(&self) -> Option<&Arc<GrammarCompiler>> {
        self.compiler.as_ref().ok()
    }

    /// Checks `constraint` against the size and depth bounds only: cheap, and done
    /// before anything else of the request is worked on.
    pub fn check_bounds(
        &self,
        constraint: &OutputConstraint,
        param: &str,
    ) -> Result<(), ServerError> {
        check_bounds(constraint, &self.limits.bounds).map_err(|e| constraint_error(param, e))
    }

    /// Compiles `constraint` for sequences sampled with `params` (their first token is
    /// checked against the format); a refusal is a 400 naming `param`, or a 503 when
    /// every compile slot stays busy past the time limit.
    pub async fn prepare(
        &self,
        constraint: &OutputConstraint,
        params: &SamplingParams,
        param: &str,
    ) -> Result<PreparedConstraint, ServerError> {
        let compiler = self.compiler.clone().map_err(|why| {
            ServerError::invalid(
                param,
                format!("structured output is not available for this model: {why}"),
            )
        })?;
        let limit = self.limits.compile_timeout;
        let deadline = Instant::now() + limit;
        let slot =
            tokio::time::timeout_at(deadline.into(), Arc::clone(&self.slots).acquire_owned())
                .await
                .map_err(|_| ServerError::CompilerBusy)?
                .map_err(|_| ServerError::Internal("the compile slots were closed".into()))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut params = params.clone();
        params.constraint = None;
        params.prepared_constraint = None;
        spawn_prepare(
            compiler,
            constraint.clone(),
            self.limits.bounds,
            params,
            move |prepared| {
                // The requester may have stopped waiting; the slot is free only now.
                let _ = tx.send(prepared);
                drop(slot);
            },
        )
        .map_err(|e| ServerError::Internal(format!("starting a grammar compile thread: {e}")))?;
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(prepared)) => prepared.map_err(|e| constraint_error(param, e)),
            Ok(Err(_)) => Err(ServerError::Internal(
                "the grammar compile thread ended without an answer".into(),
            )),
            Err(_) => Err(ServerError::invalid(
                param,
                format!(
                    "the structured output format is too complex: it did not compile within \
                     the limit of {} s",
                    limit.as_secs_f64()
                ),
            )),
        }
    }
}
