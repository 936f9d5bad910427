//! Structured output: constrained decoding with llguidance. A [`GrammarCompiler`] built
//! once per model turns a `response_format` into a [`TokenConstraint`] per sequence; the
//! sampler masks that sequence's logits with it before every choice.

mod compiler;
mod constraint;
mod mask_timing;
mod thinking;
mod token_env;

pub use compiler::GrammarCompiler;
pub use constraint::{mask_logits, TokenConstraint};
pub use mask_timing::MASK_BUCKETS_SECONDS;
pub use thinking::ThinkingGate;
