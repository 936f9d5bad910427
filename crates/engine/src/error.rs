//! The engine's one error type. Messages name the file, tensor, rank or setting at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("model file not found: {0}")]
    MissingFile(PathBuf),

    #[error("{path}: {message}")]
    BadFile { path: PathBuf, message: String },

    #[error("unsupported model architecture '{0}' (supported: llama, mistral, qwen2)")]
    UnknownArchitecture(String),

    #[error("missing tensor '{0}'")]
    MissingTensor(String),

    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    #[error("tensor '{name}' uses quantization {dtype}, which Tessera does not support")]
    UnsupportedQuantization { name: String, dtype: String },

    #[error("invalid model config: {0}")]
    Config(String),

    #[error("invalid tensor-parallel setup: {0}")]
    Parallel(String),

    #[error("rank {rank}: {message}")]
    Rank { rank: usize, message: String },

    #[error("collective aborted: {0}")]
    CommAborted(String),

    #[error("invalid step: {0}")]
    Step(String),

    #[error("{0}")]
    Candle(#[from] candle_core::Error),

    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
