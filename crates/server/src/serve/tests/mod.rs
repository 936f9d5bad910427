//! HTTP tests of `tessera serve` over real sockets: the real SmolLM2 model behind the
//! real scheduler (loaded once per test binary), and fake executors for failures the
//! real engine cannot be made to produce on demand.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod embeddings_tests;
mod fake_engine_tests;
mod harness;
mod infill_tests;
mod limits_tests;
mod mask_metrics_tests;
mod messages_tests;
mod model_tests;
mod openapi_tests;
mod ops_tests;
mod responses_tests;
mod tool_tests;
mod validation_tests;
