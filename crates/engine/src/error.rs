//! The engine's one error type. Messages name the file, tensor, rank or setting at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("model file not found: {0}")]
    MissingFile(PathBuf),

    #[error("{path}: {message}")]
    BadFile { path: PathBuf, message: String },

    /// `supported`: every architecture of the family table, as each format names them.
    #[error("unsupported model architecture '{name}' (supported: {supported})")]
    UnknownArchitecture { name: String, supported: String },

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

    /// A rank failed this step in a way that spoils only the step (a kernel error on
    /// the host, a panic): its peers were released and the group reconnects.
    #[error("rank {rank}: {message}")]
    Rank { rank: usize, message: String },

    /// The group can run no more steps: a device failed, a collective failed or timed
    /// out, a rank hung or its thread is gone.
    #[error("{}{message}", rank.map(|r| format!("rank {r}: ")).unwrap_or_default())]
    GroupFailed {
        rank: Option<usize>,
        message: String,
    },

    /// A device error on a rank (CUDA reports them sticky: the context is unusable).
    #[error("device error: {0}")]
    Device(String),

    #[error("collective aborted: {0}")]
    CommAborted(String),

    #[error("invalid step: {0}")]
    Step(String),

    /// A `response_format` schema uses a keyword the grammar compiler does not implement.
    #[error(
        "the JSON schema uses `{keyword}`, which structured output does not support: {message}"
    )]
    SchemaUnsupported { keyword: String, message: String },

    /// A `response_format` schema that is not a valid schema.
    #[error("invalid JSON schema: {0}")]
    SchemaInvalid(String),

    /// A regular expression, choice list or grammar that does not compile.
    #[error("invalid grammar: {0}")]
    GrammarInvalid(String),

    /// A constraint larger or deeper than the bounds the server sets.
    #[error("the structured output format is too large: {0}")]
    GrammarTooLarge(String),

    /// A constraint that compiles but is too complex to compute the mask of its first
    /// token within the grammar engine's limits.
    #[error("the structured output format is too complex to enforce: {0}")]
    GrammarTooComplex(String),

    /// A constraint no output can satisfy under the request's other parameters.
    #[error("the structured output format cannot be satisfied: {0}")]
    GrammarUnsatisfiable(String),

    /// The tokenizer cannot be turned into the token trie constrained decoding needs.
    #[error("structured output is unavailable for this tokenizer: {0}")]
    TokenTrie(String),

    #[error("{0}")]
    Candle(#[from] candle_core::Error),

    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl EngineError {
    /// Whether this error leaves the device group unable to run another step. Errors
    /// that are not are confined to the step (or, caught before it, to one sequence).
    pub fn fails_group(&self) -> bool {
        matches!(
            self,
            EngineError::GroupFailed { .. } | EngineError::Device(_) | EngineError::CommAborted(_)
        )
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
