//! Where a request's constraint is compiled: a thread of its own whose stack is sized
//! for the bounds, never the engine's thread. The grammar compiler recurses as deep as
//! the constraint nests; [`check_bounds`](super::bounds::check_bounds) stops anything
//! deeper than `max_depth` before it starts, and the stack here holds `max_depth` levels
//! with a wide margin. The caller bounds how many run at once and how long it waits.

use std::sync::Arc;

use tessera_protocol::{OutputConstraint, PreparedConstraint, SamplingParams};

use crate::error::{EngineError, Result};
use crate::structured::bounds::GrammarBounds;
use crate::structured::compiler::{GrammarCompiler, PreparedGrammar};

/// Stack the compiler uses per level of nesting, measured with the largest frames
/// found (a Lark rule chain), doubled.
const STACK_BYTES_PER_LEVEL: usize = 64 << 10;

/// Stack of a compile thread for constraints within `bounds`: the measured use of
/// `max_depth` levels with a margin, and never less than 16 MiB. Only the pages used are
/// ever touched.
pub fn compile_stack_bytes(bounds: &GrammarBounds) -> usize {
    bounds
        .max_depth
        .saturating_mul(STACK_BYTES_PER_LEVEL)
        .max(16 << 20)
}

/// Prepares `constraint` on a new thread and hands the result to `done` there.
pub fn spawn_prepare(
    compiler: Arc<GrammarCompiler>,
    constraint: OutputConstraint,
    bounds: GrammarBounds,
    params: SamplingParams,
    done: impl FnOnce(Result<PreparedConstraint>) + Send + 'static,
) -> Result<()> {
    std::thread::Builder::new()
        .name("tessera-grammar".into())
        .stack_size(compile_stack_bytes(&bounds))
        .spawn(move || {
            let prepared = compiler
                .prepare(&constraint, &bounds, &params)
                .map(PreparedConstraint::new);
            done(prepared);
        })
        .map(drop)
        .map_err(EngineError::Io)
}

/// The matcher a constrained sequence starts with, from its request's prepared
/// constraint.
pub fn start_constraint(
    prepared: Option<&PreparedConstraint>,
) -> std::result::Result<crate::structured::TokenConstraint, String> {
    prepared
        .and_then(|p| p.get::<PreparedGrammar>())
        .map(PreparedGrammar::start)
        .ok_or_else(|| {
            "the sequence asks for structured output but its constraint was not compiled \
             before it was submitted"
                .to_string()
        })
}
