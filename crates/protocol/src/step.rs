//! One step of the engine: what the scheduler asks for and what comes back.
//!
//! The plan is a *diff* against the executor's state: sequences appear once in
//! `new_sequences` (with their sampling parameters), are scheduled chunk by chunk, and
//! disappear through `finished`. Tokens are flattened across sequences so a step mixes
//! prefill chunks and decodes in one forward pass.

use serde::{Deserialize, Serialize};

use crate::sampling::{FinishReason, SamplingParams};

/// Identifies a sequence for its whole life, across preemptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeqId(pub u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seq-{}", self.0)
    }
}

/// A sequence the executor has not seen before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewSequence {
    pub id: SeqId,
    pub sampling: SamplingParams,
    /// The prompt. With prefix caching the first chunk may start past it, so the
    /// executor learns the prompt here (repetition penalties read it); tokens it samples
    /// later are appended to it.
    pub prompt_ids: Vec<u32>,
}

/// Tokens of one sequence to run through the model in this step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledChunk {
    pub id: SeqId,
    /// Token ids at positions `start_pos .. start_pos + tokens.len()`.
    pub tokens: Vec<u32>,
    /// Tokens of this sequence already in the KV cache (`num_computed_tokens`). A
    /// sequence recomputed after preemption starts again at 0.
    pub start_pos: usize,
    /// Physical KV block ids, in order; covers at least `start_pos + tokens.len()` tokens.
    /// With hybrid groups ([`crate::KvCacheShape::hybrid`]), group 0's.
    pub block_table: Vec<u32>,
    /// With hybrid groups, the tables of groups 1.. in order, each like `block_table`;
    /// empty with one group.
    #[serde(default)]
    pub group_tables: Vec<Vec<u32>>,
    /// Sample a next token after this chunk (false for all but the last prefill chunk).
    pub sample: bool,
    /// Speculative decoding: the last `num_draft` of `tokens` are guesses at the tokens
    /// after the sequence's last one. The executor samples after the last accepted token
    /// and after each draft, and keeps drafts while each equals the token sampled before
    /// it ([`SampledToken::accepted`]). Only with `sample`.
    #[serde(default)]
    pub num_draft: usize,
    /// Speculative decoding with a draft model: after this chunk's samples, the
    /// executor's draft model guesses up to this many tokens after the sequence's last
    /// one ([`SampledToken::proposed`]), writing its own KV at the positions that follow
    /// (the block table covers them). 0: no guesses are asked for.
    #[serde(default)]
    pub propose: usize,
}

impl ScheduledChunk {
    /// Length of the context after this chunk is computed.
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
}

/// What the executor must do in one step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepPlan {
    pub new_sequences: Vec<NewSequence>,
    pub scheduled: Vec<ScheduledChunk>,
    /// Sequences that ended: the executor drops their per-sequence state.
    pub finished: Vec<SeqId>,
}

impl StepPlan {
    /// Tokens run through the model in this step.
    pub fn num_tokens(&self) -> usize {
        self.scheduled.iter().map(|c| c.tokens.len()).sum()
    }
}

/// Log-probabilities of a sampled token and of the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// `(token, logprob)`, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// A token sampled for one sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampledToken {
    pub id: SeqId,
    pub token: u32,
    pub logprobs: Option<TokenLogprobs>,
    /// With the sequence's first token, when its sampling asks for `prompt_logprobs`:
    /// the log-probabilities of prompt tokens 1.. (the first has none).
    #[serde(default)]
    pub prompt_logprobs: Option<Vec<TokenLogprobs>>,
    /// For an embedding sequence ([`crate::SamplingParams::pooling`]), after its last
    /// prompt chunk: its embedding, and `token` means nothing.
    #[serde(default)]
    pub embedding: Option<Vec<f32>>,
    /// For a chunk with drafts: the tokens sampled after `token`, one per draft accepted
    /// (`token` equalled the first draft, each of these but the last the next one), in
    /// order, with their log-probabilities when asked for.
    #[serde(default)]
    pub accepted: Vec<(u32, Option<TokenLogprobs>)>,
    /// For a chunk with [`ScheduledChunk::propose`]: the draft model's guesses at the
    /// tokens after the last one sampled here (after `token`, or after the last of
    /// `accepted`), at most as many as asked for.
    #[serde(default)]
    pub proposed: Vec<u32>,
}

/// A sequence the executor refused in a step that otherwise ran: its own input is at
/// fault (a token id outside the model's embedding, a block outside the cache).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedSequence {
    pub id: SeqId,
    pub message: String,
    /// The sequence's own request cannot be carried out (a structured output format
    /// too complex to enforce, or one its other parameters make unsatisfiable): the
    /// client's error, not the engine's.
    #[serde(default)]
    pub by_request: bool,
}

/// The result of a step: one sample per chunk with `sample == true`, in plan order,
/// except for the sequences listed in `failed`, which have none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepOutput {
    pub samples: Vec<SampledToken>,
    /// Sequences that failed alone; the scheduler ends them, the rest go on.
    pub failed: Vec<FailedSequence>,
    /// With a draft model: what its part of the step took (`None`: it did not run).
    #[serde(default)]
    pub draft: Option<DraftTime>,
}

/// The draft model's share of a step: the scheduler's cost of a guess counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DraftTime {
    /// Its forward passes that made guesses (one per guess position).
    pub passes: usize,
    /// Seconds of all its passes in the step (following prefills included).
    pub seconds: f64,
}

/// What a request's receiver gets from the scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TokenEvent {
    /// A generated token; the first one carries the prompt's log-probabilities when the
    /// sampling asks for `prompt_logprobs` (in the same event: no extra channel slot).
    Token {
        token: u32,
        logprobs: Option<TokenLogprobs>,
        prompt_logprobs: Option<Vec<TokenLogprobs>>,
    },
    /// An embedding sequence's embedding; `Finished` follows.
    Embedding(Vec<f32>),
    /// The sequence ended; no further events follow.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// The engine failed (a device or collective): no further events follow, and no
    /// later request can run.
    Error(String),
    /// This sequence failed (its step, or its own input), and the engine keeps serving:
    /// no further events follow.
    Failed(String),
    /// This sequence's request cannot be carried out as asked (see
    /// [`FailedSequence::by_request`]): a client error; no further events follow.
    Refused(String),
}
