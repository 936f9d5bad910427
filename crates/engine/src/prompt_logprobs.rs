//! Log-probabilities of a sequence's prompt tokens (`SamplingParams::prompt_logprobs`):
//! the logits of each prompt position give the log-probability of the next prompt token.
//! They are gathered over the sequence's prefill chunks and handed over with its first
//! sampled token.

use tessera_protocol::{ScheduledChunk, TokenLogprobs};

use crate::sampler::logprobs_of;

/// One sequence's prompt log-probabilities, gathered until its first token.
#[derive(Debug)]
pub(crate) struct PromptLogprobs {
    /// Alternatives per position.
    top: usize,
    prompt: Vec<u32>,
    /// By prompt position; position 0 has none.
    got: Vec<Option<TokenLogprobs>>,
    sent: bool,
}

impl PromptLogprobs {
    pub(crate) fn new(prompt: &[u32], top: usize) -> Self {
        Self {
            top,
            prompt: prompt.to_vec(),
            got: vec![None; prompt.len()],
            sent: false,
        }
    }

    /// The positions of `chunk` whose logits are wanted, as `(row offset in the chunk,
    /// prompt position they score)`: every position whose next token is in the prompt,
    /// until the first token has been handed over. A chunk recomputed after preemption
    /// scores its positions again.
    pub(crate) fn wanted(&self, chunk: &ScheduledChunk) -> Vec<(usize, usize)> {
        if self.sent {
            return Vec::new();
        }
        (chunk.start_pos..chunk.end_pos())
            .filter(|pos| pos + 1 < self.prompt.len())
            .map(|pos| (pos - chunk.start_pos, pos + 1))
            .collect()
    }

    /// Scores prompt position `pos` from the logits of the position before it.
    pub(crate) fn record(&mut self, pos: usize, logits: &[f32]) {
        if let (Some(slot), Some(&token)) = (self.got.get_mut(pos), self.prompt.get(pos)) {
            *slot = Some(logprobs_of(logits, token, self.top));
        }
    }

    /// With the first sampled token: the log-probabilities of prompt tokens 1.., once.
    /// An error names a position that was never computed.
    pub(crate) fn take(&mut self) -> Option<Result<Vec<TokenLogprobs>, String>> {
        if self.sent {
            return None;
        }
        self.sent = true;
        let got = std::mem::take(&mut self.got);
        Some(
            got.into_iter()
                .enumerate()
                .skip(1)
                .map(|(pos, lp)| {
                    lp.ok_or_else(|| {
                        format!("the log-probability of prompt position {pos} was never computed")
                    })
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::SeqId;

    fn chunk(start_pos: usize, n: usize) -> ScheduledChunk {
        ScheduledChunk {
            id: SeqId(1),
            tokens: vec![0; n],
            start_pos,
            block_table: vec![],
            sample: false,
            num_draft: 0,
            propose: 0,
            group_tables: Vec::new(),
        }
    }

    #[test]
    fn every_prompt_position_after_the_first_is_scored_once_across_chunks() {
        let mut p = PromptLogprobs::new(&[5, 1, 2, 0], 1);
        // Chunks [0, 2) and [2, 4): rows 0, 1 score positions 1, 2; row 0 of the second
        // scores position 3; the last row's logits choose the first new token.
        assert_eq!(p.wanted(&chunk(0, 2)), vec![(0, 1), (1, 2)]);
        assert_eq!(p.wanted(&chunk(2, 2)), vec![(0, 3)]);
        let logits = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        for pos in 1..3 {
            p.record(pos, &logits);
        }
        // Position 3 missing: named.
        let mut q = PromptLogprobs::new(&[5, 1, 2, 0], 1);
        q.record(1, &logits);
        let err = q.take().and_then(|r| r.err()).unwrap_or_default();
        assert!(err.contains("position 2"), "{err}");
        p.record(3, &logits);
        let got = p.take().and_then(|r| r.ok()).unwrap_or_default();
        assert_eq!(got.len(), 3);
        // Token 1 at position 1: log-softmax of logit 1.0; token 0 at position 3.
        let lse = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
        assert!((got[0].logprob - (1.0 - lse)).abs() < 1e-5);
        assert!((got[2].logprob - (0.0 - lse)).abs() < 1e-5);
        assert_eq!(got[0].top[0].0, 5, "the most likely alternative");
        // Handed over once; afterwards no rows are wanted.
        assert!(p.take().is_none());
        assert!(p.wanted(&chunk(0, 4)).is_empty());
    }
}
