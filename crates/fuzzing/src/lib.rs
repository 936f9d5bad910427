//! What each fuzz target checks, as plain functions over bytes. The `fuzz/` targets are
//! one-line wrappers around them, and `tests/replay.rs` runs the committed seeds and every
//! crash input ever found through them in the normal test suite.
//!
//! Each function panics exactly when a property fails: a panic in the code under test, or
//! an answer that is wrong (an error that is not a client error, an SSE frame that does
//! not parse back, ...). Everything else (a refused input) is a pass.

mod grammar;
mod model;
mod requests;
mod sse;
mod template;
mod tokens;
mod weights;

pub use grammar::structured_output;
pub use requests::{chat_request, completion_request};
pub use sse::sse_frames;
pub use template::chat_template;
pub use tokens::tokenizer;
pub use weights::{gguf_header, safetensors_header};

/// A target's check: panics when a property fails.
pub type Check = fn(&[u8]);

/// Names of the fuzz targets, as in `fuzz/fuzz_targets/<name>.rs`, with their functions.
pub const TARGETS: &[(&str, Check)] = &[
    ("chat_request", chat_request),
    ("completion_request", completion_request),
    ("chat_template", chat_template),
    ("gguf_header", gguf_header),
    ("safetensors_header", safetensors_header),
    ("tokenizer", tokenizer),
    ("sse_frames", sse_frames),
    ("structured_output", structured_output),
];
