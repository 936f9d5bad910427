//! Speculative decoding: guesses at the tokens after a decoding sequence's last one,
//! scored by the executor in the same forward pass as the sequence's next token, which
//! keeps those its own samples agree with, so output is what it would be without
//! speculation; a step gains a token per accepted guess. How many of the guesses a
//! sequence is given, if any, is decided by the scheduler's `speculation_policy` from
//! what its guesses earned and what a row costs.
//!
//! Two sources of guesses:
//! - `ngram` (prompt lookup decoding): the tokens that followed the latest earlier
//!   occurrence of the sequence's last few tokens, found here in the scheduler;
//! - `draft_model`: a smaller model with the same tokenizer, run by the executor after
//!   each step it is asked to ([`tessera_protocol::ScheduledChunk::propose`]); its
//!   greedy guesses come back with the step's samples and are scored in the next step.
//!   A greedy draft is a function of the context, so keeping a guess exactly when the
//!   target's own sample equals it preserves the target's distribution under any
//!   sampling (the guess is accepted with the probability the target gives it, and a
//!   rejection leaves the target's sample, drawn from the rest).

/// How guesses are made (`--speculative-config`'s `method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculation {
    Ngram(NgramSpeculation),
    DraftModel(DraftModelSpeculation),
}

impl Speculation {
    /// Why these numbers cannot be used, naming the field.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Speculation::Ngram(s) => s.check(),
            Speculation::DraftModel(s) => check_count(s.num_speculative_tokens),
        }
    }

    /// A step with more decoding sequences than this guesses nothing.
    pub fn disable_by_batch_size(&self) -> usize {
        match self {
            Speculation::Ngram(s) => s.disable_by_batch_size,
            Speculation::DraftModel(s) => s.disable_by_batch_size,
        }
    }

    /// Most tokens guessed per sequence and step.
    pub fn num_speculative_tokens(&self) -> usize {
        match self {
            Speculation::Ngram(s) => s.num_speculative_tokens,
            Speculation::DraftModel(s) => s.num_speculative_tokens,
        }
    }
}

impl From<NgramSpeculation> for Speculation {
    fn from(s: NgramSpeculation) -> Self {
        Speculation::Ngram(s)
    }
}

impl From<DraftModelSpeculation> for Speculation {
    fn from(s: DraftModelSpeculation) -> Self {
        Speculation::DraftModel(s)
    }
}

/// `{"method": "draft_model", ...}`: the executor runs the draft model; the scheduler
/// asks it for guesses and reserves the KV positions the draft writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftModelSpeculation {
    /// Most tokens guessed per sequence and step.
    pub num_speculative_tokens: usize,
    /// As for [`NgramSpeculation::disable_by_batch_size`].
    pub disable_by_batch_size: usize,
}

fn check_count(k: usize) -> Result<(), String> {
    if k == 0 || k > 16 {
        return Err(format!("num_speculative_tokens is {k}; it must be 1 to 16"));
    }
    Ok(())
}

/// `{"method": "ngram", ...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramSpeculation {
    /// Most tokens guessed per sequence and step.
    pub num_speculative_tokens: usize,
    /// Shortest and longest suffix looked up.
    pub prompt_lookup_min: usize,
    pub prompt_lookup_max: usize,
    /// A step with more decoding sequences than this guesses nothing: a batch that
    /// large already reads each weight for many tokens, and the guessed tokens would
    /// only add work.
    pub disable_by_batch_size: usize,
}

impl NgramSpeculation {
    /// Why these numbers cannot be used, naming the field.
    pub fn check(&self) -> Result<(), String> {
        check_count(self.num_speculative_tokens)?;
        if self.prompt_lookup_min == 0 || self.prompt_lookup_min > self.prompt_lookup_max {
            return Err(format!(
                "prompt_lookup_min ({}) must be at least 1 and at most prompt_lookup_max ({})",
                self.prompt_lookup_min, self.prompt_lookup_max
            ));
        }
        Ok(())
    }

    /// Up to `limit` guessed tokens after `tokens`: from the longest suffix (of
    /// `prompt_lookup_max` down to `prompt_lookup_min` tokens) that occurred earlier, the
    /// tokens that followed its latest earlier occurrence.
    pub fn propose(&self, tokens: &[u32], limit: usize) -> Proposal {
        let limit = limit.min(self.num_speculative_tokens);
        if limit == 0 {
            return Proposal::default();
        }
        let len = tokens.len();
        for n in (self.prompt_lookup_min..=self.prompt_lookup_max.min(len.saturating_sub(1))).rev()
        {
            let suffix = &tokens[len - n..];
            // The latest occurrence before the suffix itself (it may overlap the suffix;
            // a token always follows it).
            let found = (0..len - n)
                .rev()
                .find(|&start| &tokens[start..start + n] == suffix);
            if let Some(start) = found {
                let from = start + n;
                let to = (from + limit).min(len);
                return Proposal {
                    tokens: tokens[from..to].to_vec(),
                    match_len: n,
                };
            }
        }
        Proposal::default()
    }
}

/// Guessed tokens and the length of the suffix match they follow (0: none found).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    pub match_len: usize,
}

/// Counters of the guesses made and kept (vLLM's `spec_decode` metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpeculationCounters {
    /// Sequence steps that carried guesses.
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    /// Per guess position (0 first), how many were accepted.
    pub accepted_per_position: Vec<u64>,
}

impl SpeculationCounters {
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        self.drafts += 1;
        self.draft_tokens += drafted as u64;
        self.accepted_tokens += accepted as u64;
        if self.accepted_per_position.len() < accepted {
            self.accepted_per_position.resize(accepted, 0);
        }
        for n in &mut self.accepted_per_position[..accepted] {
            *n += 1;
        }
    }
}

/// The executor's contract for a chunk with guesses: each accepted guess equals the
/// token sampled before it, and no more are accepted than were made.
pub(crate) fn check_accepted(
    sample: &tessera_protocol::SampledToken,
    drafts: &[u32],
) -> Result<(), crate::error::SchedulerError> {
    let n = sample.accepted.len();
    let sampled = std::iter::once(sample.token).chain(sample.accepted.iter().map(|(t, _)| *t));
    if n > drafts.len() || !sampled.take(n).eq(drafts[..n].iter().copied()) {
        return Err(crate::error::SchedulerError::OutputMismatch(format!(
            "{} accepted {n} guesses that do not follow its samples (guesses {drafts:?})",
            sample.id
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ngram(k: usize, min: usize, max: usize) -> NgramSpeculation {
        NgramSpeculation {
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
            disable_by_batch_size: 8,
        }
    }

    #[test]
    fn the_longest_suffix_seen_before_gives_what_followed_it() {
        let s = ngram(3, 1, 3);
        // "1 2 3" occurred with "4 5 6" after it; the suffix "2 3" too, later, with "9".
        let tokens = [1, 2, 3, 4, 5, 6, 2, 3, 9, 1, 2, 3];
        let guess = |s: &NgramSpeculation, t: &[u32], limit| s.propose(t, limit).tokens;
        assert_eq!(
            s.propose(&tokens, 8),
            Proposal {
                tokens: vec![4, 5, 6],
                match_len: 3
            }
        );
        // At most `limit`, and at most what the context holds after the match.
        assert_eq!(guess(&s, &tokens, 2), vec![4, 5]);
        assert_eq!(s.propose(&[7, 8, 7], 3).tokens, vec![8, 7]);
        assert_eq!(s.propose(&[7, 8, 7], 3).match_len, 1);
        // Nothing seen before: no guess.
        assert_eq!(s.propose(&[1, 2, 3, 4], 3), Proposal::default());
        assert!(guess(&s, &[5], 3).is_empty());
        // A shorter suffix is tried when the longer one is new; the latest occurrence wins.
        let tokens = [5, 1, 8, 6, 1, 9, 7, 1];
        assert_eq!(guess(&ngram(2, 1, 2), &tokens, 2), vec![9, 7]);
        assert!(guess(&ngram(2, 2, 2), &tokens, 2).is_empty());
    }

    #[test]
    fn bad_numbers_are_named() {
        assert!(ngram(0, 1, 3)
            .check()
            .unwrap_err()
            .contains("num_speculative_tokens"));
        assert!(ngram(4, 3, 2)
            .check()
            .unwrap_err()
            .contains("prompt_lookup_min"));
        assert!(ngram(4, 0, 2).check().is_err());
        assert!(ngram(4, 1, 4).check().is_ok());
    }

    #[test]
    fn counters_count_per_position() {
        let mut c = SpeculationCounters::default();
        c.record(4, 2);
        c.record(4, 0);
        c.record(3, 3);
        assert_eq!((c.drafts, c.draft_tokens, c.accepted_tokens), (3, 11, 5));
        assert_eq!(c.accepted_per_position, vec![2, 2, 1]);
    }
}
