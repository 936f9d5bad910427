//! Structured output: constrained decoding with llguidance. A [`GrammarCompiler`] built
//! once per model prepares a request's `response_format` once, within [`GrammarBounds`]
//! and on a thread of its own ([`spawn_prepare`]); each sequence starts a
//! [`TokenConstraint`] from it, and the sampler masks that sequence's logits with it
//! before every choice.

pub mod bounds;
mod compile_thread;
mod compiler;
mod constraint;
mod mask_timing;
mod thinking;
mod token_env;

pub use bounds::{check_bounds, GrammarBounds};
pub use compile_thread::{compile_stack_bytes, spawn_prepare, start_constraint};
pub use compiler::{GrammarCompiler, PreparedGrammar};
pub use constraint::{mask_logits, GrammarFault, TokenConstraint};
pub use mask_timing::MASK_BUCKETS_SECONDS;
pub use thinking::ThinkingGate;
