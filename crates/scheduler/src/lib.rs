//! Continuous batching.
