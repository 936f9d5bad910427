//! What a reply's split gives: its thinking and its answer.

/// Text split into thinking and answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}
