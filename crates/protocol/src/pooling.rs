//! Embedding sequences: a prompt run once through the model, whose final hidden states
//! are pooled into one vector instead of a next token being sampled.

use serde::{Deserialize, Serialize};

/// Which of a prompt's final hidden states make its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolingKind {
    /// The last token's (Qwen3-Embedding and other decoder embedders).
    Last,
    /// The mean over every token.
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
}

impl PoolingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolingKind::Last => "last",
            PoolingKind::Mean => "mean",
            PoolingKind::Cls => "cls",
        }
    }

    /// Whether the embedding needs the hidden state of every prompt position, so no
    /// prefix-cache hit may skip any.
    pub fn needs_every_position(self) -> bool {
        !matches!(self, PoolingKind::Last)
    }
}

/// How a sequence's embedding is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pooling {
    pub kind: PoolingKind,
    /// Scale the pooled vector to unit length.
    pub normalize: bool,
}
