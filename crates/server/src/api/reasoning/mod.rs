//! Splitting a reply's thinking from its answer: at `<think>` tags or by harmony's
//! channels, as text streams.

pub mod harmony;
pub mod split;
pub mod think;

pub use split::Split;
pub use think::*;
