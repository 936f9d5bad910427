//! What one decoding sequence guesses in a step: the guesses scored in it, and how many
//! the draft model is asked to make after it.

use crate::sequence::Sequence;
use crate::speculation::{Proposal, Speculation};

/// A sequence's speculative part of one chunk.
#[derive(Debug, Default)]
pub(crate) struct ChunkGuesses {
    /// Guesses scored after the chunk's tokens.
    pub drafts: Proposal,
    /// Guesses the draft model makes after the chunk's samples (KV positions it writes
    /// beyond those the chunk reaches).
    pub propose: usize,
}

impl ChunkGuesses {
    /// KV positions past the chunk's own tokens that the step writes.
    pub fn ahead(&self) -> usize {
        self.drafts.tokens.len() + self.propose
    }
}

/// The guesses of a chunk of `num_new` tokens of `seq` (no more than the step's budget,
/// its client's channel, its `max_tokens` and the context leave room for beside the
/// tokens it runs anyway), and only as many as its record says pay at `threshold`.
pub(crate) fn guesses_for(
    spec: &Speculation,
    max_model_len: usize,
    seq: &mut Sequence,
    num_new: usize,
    budget: usize,
    threshold: f64,
) -> ChunkGuesses {
    if seq.sampling.pooling.is_some() || seq.sampling.prompt_logprobs.is_some() {
        return ChunkGuesses::default();
    }
    let left_to_generate = seq.stop.max_tokens.saturating_sub(seq.num_output_tokens());
    let left_in_context = max_model_len.saturating_sub(seq.num_tokens());
    let limit = [
        budget.saturating_sub(num_new),
        seq.sender.token_room().saturating_sub(1),
        left_to_generate.saturating_sub(1),
        left_in_context.saturating_sub(1),
    ]
    .into_iter()
    .min()
    .unwrap_or(0);
    let decodes = num_new == 1 && seq.num_uncomputed() == 1;
    match spec {
        Speculation::Ngram(ngram) => {
            let mut drafts = match decodes {
                true => ngram.propose(&seq.tokens, limit),
                false => Proposal::default(),
            };
            let k = seq
                .guesses
                .guesses_to_make(drafts.match_len, drafts.tokens.len(), threshold);
            drafts.tokens.truncate(k);
            ChunkGuesses { drafts, propose: 0 }
        }
        Speculation::DraftModel(d) => {
            // How many the draft makes was decided when they were asked for.
            let drafts = match decodes {
                true => seq.model_guesses(limit),
                false => Proposal::default(),
            };
            if num_new != seq.num_uncomputed() {
                return ChunkGuesses { drafts, propose: 0 };
            }
            // The draft guesses after whatever this chunk samples: after its last
            // token, or after the last guess kept; the context must hold its guesses
            // for the next step. As many as pay at the odds its guesses have had.
            let room = d
                .num_speculative_tokens
                .min(left_in_context.saturating_sub(drafts.tokens.len() + 1))
                .min(left_to_generate.saturating_sub(drafts.tokens.len() + 1));
            let propose = seq.guesses.guesses_to_make(0, room, threshold);
            ChunkGuesses { drafts, propose }
        }
    }
}
