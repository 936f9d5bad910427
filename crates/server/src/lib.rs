//! The OpenAI-compatible HTTP server behind the `tessera` binary: request parsing and
//! validation (`api`), the routes, streaming and lifecycle (`serve`), and the command-line
//! and layered configuration.
//!
//! A library as well as a binary so that fuzz targets and benchmarks reach the same
//! parsing and validation code the server runs.

pub mod api;
pub mod chat_cmd;
pub mod cli;
pub mod config_layers;
mod config_values;
pub mod generate_cmd;
pub mod help_headings;
pub mod hub;
pub mod model_args;
pub mod models_cmd;
pub mod node_args;
pub mod runner;
pub mod serve;
pub mod speculation_args;
pub mod template_sandbox;
#[cfg(test)]
pub(crate) mod test_fixtures;
