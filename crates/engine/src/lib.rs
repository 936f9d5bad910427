//! The Tessera engine: what a model is (`spec`) and how each family's files describe it
//! (`families`), reading those files (`loader`: GGUF and safetensors), the one decoder
//! every family runs (`model`), tensor parallelism (`tp`: shard plans, communicators),
//! devices (`device`), one worker thread per rank, sampling, and the [`Engine`] that
//! loads a model and runs its steps (`engine`; `cluster` for a group of nodes). It
//! implements the scheduler's `Executor`; it knows nothing of HTTP or scheduling.

pub mod cluster;
pub mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod families;
pub mod generate;
pub mod loader;
pub mod model;
mod prompt_logprobs;
pub mod sampler;
// The sampler's tests, in the file beside it.
#[cfg(test)]
mod sampler_tests;
pub mod spec;
pub mod stats;
pub mod structured;
#[cfg(feature = "gpu-emulation")]
pub mod test_models;
pub mod thinking_budget;
pub mod tp;
mod worker;

pub use config::EngineConfig;
pub use device::{DeviceLayers, DeviceMemory, DeviceSpec, LayerMap, Stage};
pub use engine::draft::{load_drafted, Drafted};
pub use engine::Engine;
pub use error::{EngineError, Result};
pub use generate::{generate, generate_sampled, GenerateOptions};
pub use loader::{check_vocabulary, default_model_path, load_tokenizer};
pub use spec::{Activation, ModelConfig, RopeStyle};
pub use stats::{EngineStats, RankSnapshot};
pub use structured::{GrammarCompiler, TokenConstraint};
pub use tessera_tokenizer::Tokenizer;
pub use worker::Fault;
