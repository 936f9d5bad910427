//! Test hook, compiled only with the `fault-injection` feature (release builds have no
//! such flag): `--inject-fault RANK:KIND:AFTER_STEPS` makes device rank RANK fail in the
//! way KIND (`error`, `panic`, `device` or `hang`) in the step after AFTER_STEPS steps that ran
//! sequences (the warm-up's included). The fault goes through the engine's own
//! [`tessera_engine::Engine::inject_fault`], so what follows is exactly what a real device failure does.

use std::str::FromStr;

use tessera_engine::Fault;
use tessera_protocol::{Executor, ExecutorError, KvCacheShape, StepOutput, StepPlan};

use crate::serve::served_engine::ServedEngine;

/// Where, how and when to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultSpec {
    pub rank: usize,
    pub fault: Fault,
    pub after_steps: u64,
}

impl FromStr for FaultSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage =
            || format!("`{s}`: expected RANK:KIND:AFTER_STEPS, KIND error|panic|device|hang");
        let mut parts = s.split(':');
        let (Some(rank), Some(kind), Some(after), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(usage());
        };
        let fault = match kind {
            "error" => Fault::Error,
            "panic" => Fault::Panic,
            "hang" => Fault::Hang,
            "device" => Fault::Device,
            _ => return Err(usage()),
        };
        Ok(FaultSpec {
            rank: rank.parse().map_err(|_| usage())?,
            fault,
            after_steps: after.parse().map_err(|_| usage())?,
        })
    }
}

/// The engine, with one fault armed.
pub struct FaultyEngine {
    engine: ServedEngine,
    spec: FaultSpec,
    steps: u64,
    injected: bool,
}

impl FaultyEngine {
    pub fn new(engine: ServedEngine, spec: FaultSpec) -> Self {
        Self {
            engine,
            spec,
            steps: 0,
            injected: false,
        }
    }
}

impl Executor for FaultyEngine {
    fn step(&mut self, plan: &StepPlan) -> Result<StepOutput, ExecutorError> {
        if !plan.scheduled.is_empty() {
            if !self.injected && self.steps >= self.spec.after_steps {
                self.injected = true;
                // Tests time detection from this line.
                tracing::warn!(
                    "fault injection: rank {} {:?} now, at step {}",
                    self.spec.rank,
                    self.spec.fault,
                    self.steps
                );
                self.engine
                    .target()
                    .inject_fault(self.spec.rank, self.spec.fault)
                    .map_err(|e| {
                        ExecutorError::group(
                            Some(self.spec.rank),
                            format!("cannot inject the fault: {e}"),
                        )
                    })?;
            }
            self.steps += 1;
        }
        self.engine.step(plan)
    }

    fn kv_cache_shape(&self) -> KvCacheShape {
        self.engine.kv_cache_shape()
    }

    fn max_context_tokens(&self) -> usize {
        self.engine.max_context_tokens()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        assert_eq!(
            "1:hang:40".parse::<FaultSpec>(),
            Ok(FaultSpec {
                rank: 1,
                fault: Fault::Hang,
                after_steps: 40
            })
        );
        assert_eq!(
            "0:device:3".parse::<FaultSpec>().map(|f| f.fault),
            Ok(Fault::Device)
        );
        for bad in ["1:hang", "1:melt:4", "x:error:1", "1:error:1:2", ""] {
            assert!(bad.parse::<FaultSpec>().is_err(), "{bad}");
        }
    }
}
