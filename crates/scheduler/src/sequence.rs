//! One generation as the scheduler tracks it.
//!
//! A sequence has `num_tokens` tokens (prompt + generated) of which the first
//! `num_computed_tokens` are in its KV cache. There are no prefill/decode phases: the
//! scheduler runs `num_tokens - num_computed_tokens` more tokens in chunks, and a chunk
//! that reaches `num_tokens` samples the next token.

use crate::admission::{AdmittedRequest, QueuePermit};
use crate::speculation::Proposal;
use crate::speculation_policy::GuessHistory;
use crate::token_channel::TokenSender;
use tessera_protocol::{FinishReason, SamplingParams, SeqId, StopCondition, TokenEvent};

/// Tokens a step gives the chunks of sequences that score their prompts: at most 128
/// full logits rows a step (64 MiB for a 128k vocabulary).
pub const PROMPT_LOGPROBS_CHUNK: usize = 128;

#[derive(Debug)]
pub(crate) struct Sequence {
    pub id: SeqId,
    /// Prompt followed by generated tokens. Invariant: never longer than the admission
    /// bound `prompt_len + stop.max_tokens`, which fits `max_model_len` and the cache
    /// (or the attention window plus a chunk, when the window bounds what it holds).
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose KV is in this sequence's blocks (or planned in the step in flight).
    /// Reset to 0 on preemption.
    pub num_computed_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: StopCondition,
    /// Prefix-cache isolation: only blocks cached under the same salt are shared.
    pub cache_salt: Option<String>,
    pub sender: TokenSender,
    /// The executor has seen this sequence in `new_sequences` and holds state for it
    /// until it is listed in `finished`.
    pub announced: bool,
    /// Held while the request waits for its first step.
    pub permit: Option<QueuePermit>,
    /// When the request was admitted.
    pub submitted: std::time::Instant,
    /// How its speculative guesses fared (what decides how many it is given).
    pub guesses: GuessHistory,
    /// The draft model's guesses after the first `guessed_after` tokens; stale once the
    /// sequence has moved on.
    pub drafted: Vec<u32>,
    pub guessed_after: usize,
}

impl Sequence {
    pub fn new(admitted: AdmittedRequest) -> Self {
        let AdmittedRequest {
            id,
            request,
            sender,
            permit,
            submitted,
        } = admitted;
        Self {
            id,
            prompt_len: request.prompt_ids.len(),
            tokens: request.prompt_ids,
            num_computed_tokens: 0,
            sampling: request.sampling,
            stop: request.stop,
            cache_salt: request.cache_salt,
            sender,
            announced: false,
            submitted,
            permit: Some(permit),
            guesses: GuessHistory::default(),
            drafted: Vec::new(),
            guessed_after: 0,
        }
    }

    /// Up to `limit` of the draft model's guesses at the tokens after the last one,
    /// when they were made after it.
    pub fn model_guesses(&self, limit: usize) -> Proposal {
        if self.guessed_after != self.tokens.len() {
            return Proposal::default();
        }
        Proposal {
            tokens: self.drafted.iter().take(limit).copied().collect(),
            match_len: 0,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn num_output_tokens(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to run through the model before the next sample.
    pub fn num_uncomputed(&self) -> usize {
        self.tokens.len().saturating_sub(self.num_computed_tokens)
    }

    /// Whether this sequence's next chunk scores prompt tokens: its prompt's
    /// log-probabilities are wanted and some position before its last is not computed.
    /// The full logits of every such position are made in the step (`tokens ×
    /// vocabulary` f32: 1 GiB for 2048 tokens of a 128k vocabulary), so the chunks of
    /// all such sequences share [`PROMPT_LOGPROBS_CHUNK`] tokens a step.
    pub fn scores_prompt(&self) -> bool {
        self.sampling.prompt_logprobs.is_some() && self.num_computed_tokens + 1 < self.prompt_len
    }

    /// The client dropped its receiver.
    pub fn is_cancelled(&self) -> bool {
        self.sender.is_closed()
    }

    /// Why the sequence must end after its latest token, if it must.
    pub fn stop_reason(&self, max_model_len: usize) -> Option<FinishReason> {
        let last = *self.tokens.last()?;
        if self.num_output_tokens() > 0 && self.stop.stops_at(last) {
            return Some(FinishReason::Stop);
        }
        if self.num_output_tokens() >= self.stop.max_tokens || self.num_tokens() >= max_model_len {
            return Some(FinishReason::Length);
        }
        None
    }

    /// Send an event; false when the receiver is gone.
    pub fn send(&self, event: TokenEvent) -> bool {
        self.sender.send(event)
    }

    /// Tells the client how much of the prompt the prefix cache held.
    pub fn report_cached_prompt_tokens(&self, tokens: usize) {
        self.sender.set_cached_prompt_tokens(tokens);
    }

    pub fn finished_event(&self, reason: FinishReason) -> TokenEvent {
        TokenEvent::Finished {
            reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: self.num_output_tokens(),
        }
    }
}
