//! One constrained sequence's grammar state: the mask for its next token, advanced by
//! every token it accepts. Lives in the sequence's sampler, so it survives preemption
//! (recompute replays tokens the matcher has already consumed and samples nothing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use tessera_protocol::DurationHistogram;

/// The grammar matcher of one sequence.
pub struct TokenConstraint {
    matcher: Matcher,
    counters: Arc<DurationHistogram>,
    /// Time spent computing and applying this sequence's masks.
    mask_time: Duration,
    masks: u64,
    /// Set when the grammar engine failed; the sequence must then fail.
    fault: Option<GrammarFault>,
}

/// Why a constrained sequence cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarFault {
    pub message: String,
    /// The request is at fault, not the server: its format is too complex for the
    /// grammar engine's limits, or its other parameters rule out every token the format
    /// allows next. A client error, not worth retrying as it is.
    pub by_request: bool,
}

impl GrammarFault {
    /// A failure of the grammar engine on `error`: the request's when the engine stopped
    /// at its complexity limits (its lexer's or parser's: "lexer error: too many
    /// expressions constructed", "Current row has 2807 items; max is 2000"), the
    /// engine's own otherwise (a token its mask allowed, then refused). Only the error's
    /// first line is kept: the rest is the grammar engine's state.
    fn from_engine(context: &str, error: &str) -> Self {
        let first = error.lines().next().unwrap_or(error);
        let limits = [
            "lexer error:",
            "parser error:",
            "items; max is",
            "too many",
            "fuel",
        ];
        Self {
            message: format!("{context}: {first}"),
            by_request: limits.iter().any(|l| first.contains(l)),
        }
    }
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint")
            .field("stopped", &self.matcher.is_stopped())
            .field("error", &self.matcher.get_error())
            .field("masks", &self.masks)
            .finish_non_exhaustive()
    }
}

impl TokenConstraint {
    pub(crate) fn new(matcher: Matcher, counters: Arc<DurationHistogram>) -> Self {
        Self {
            matcher,
            counters,
            mask_time: Duration::ZERO,
            masks: 0,
            fault: None,
        }
    }

    /// Sets every token the grammar does not allow next to `-inf`. Once the grammar is
    /// complete only end-of-sequence tokens remain, so the sequence stops there.
    pub fn apply_mask(&mut self, logits: &mut [f32]) {
        let started = Instant::now();
        let mask = match self.matcher.compute_mask_or_eos() {
            Ok(mask) => mask,
            Err(e) => {
                // A token the mask allowed was refused: a grammar engine fault. The
                // sequence fails (see `fault`); masking to end-of-sequence keeps this
                // step's row inside the grammar meanwhile.
                tracing::warn!("constrained decoding failed: {e}");
                self.fault.get_or_insert_with(|| {
                    GrammarFault::from_engine("constrained decoding failed", &format!("{e:#}"))
                });
                self.eos_only()
            }
        };
        mask_logits(&mask, logits);
        let took = started.elapsed();
        self.counters.record(took);
        self.mask_time += took;
        self.masks += 1;
    }

    /// Advances the grammar past `token`, the sequence's next token.
    pub fn advance(&mut self, token: u32) {
        if self.matcher.is_stopped() {
            // Past the end of the grammar only end-of-sequence tokens were allowed.
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            tracing::warn!("constrained decoding refused token {token}: {e}");
            self.fault.get_or_insert_with(|| {
                GrammarFault::from_engine(
                    &format!("constrained decoding refused token {token}"),
                    &format!("{e:#}"),
                )
            });
        }
    }

    /// Records that the request's other parameters (`bad_words`, `allowed_token_ids`,
    /// `min_tokens`) left none of the tokens the grammar allows next.
    pub fn no_token_left(&mut self) {
        self.fault.get_or_insert_with(|| GrammarFault {
            message: "the structured output format cannot be satisfied: every token it \
                      allows next is ruled out by `bad_words`, `allowed_token_ids` or \
                      `min_tokens`"
                .into(),
            by_request: true,
        });
    }

    /// Why the grammar engine failed, if it did: the sequence cannot go on under its
    /// grammar and must end with an error, not as if it had finished.
    pub fn fault(&self) -> Option<&GrammarFault> {
        self.fault.as_ref()
    }

    /// Whether the output so far is a complete value of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// The text of `token` (a special token's name), as the grammar engine sees it.
    pub fn token_bytes(&self, token: u32) -> Vec<u8> {
        match self.matcher.tok_env() {
            Ok(env) => env.tok_trie().decode(&[token]),
            Err(_) => Vec::new(),
        }
    }

    /// Masks computed and the time they took.
    pub fn mask_stats(&self) -> (u64, Duration) {
        (self.masks, self.mask_time)
    }

    fn eos_only(&self) -> SimpleVob {
        match self.matcher.tok_env() {
            Ok(env) => env.tok_trie().eos_token_set(),
            Err(_) => SimpleVob::new(),
        }
    }
}

/// Sets logits of tokens not in `mask` to `-inf`. Rows longer than the mask lose their
/// tail; a mask allowing nothing in the row leaves the row unchanged rather than all
/// `-inf` (the caller's error path has already logged why).
pub fn mask_logits(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    let limit = mask.len().min(logits.len());
    if mask.num_set() == 0 {
        return;
    }
    for (w, chunk) in logits[..limit].chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    logits[limit..].fill(f32::NEG_INFINITY);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vob(len: usize, allowed: &[u32]) -> SimpleVob {
        let mut v = SimpleVob::alloc(len);
        for &t in allowed {
            v.allow_token(t);
        }
        v
    }

    #[test]
    fn disallowed_tokens_become_neg_infinity() {
        let mut logits: Vec<f32> = (0..70).map(|i| i as f32).collect();
        mask_logits(&vob(70, &[0, 31, 32, 69]), &mut logits);
        for (i, l) in logits.iter().enumerate() {
            if [0, 31, 32, 69].contains(&i) {
                assert_eq!(*l, i as f32, "allowed token {i} kept");
            } else {
                assert_eq!(*l, f32::NEG_INFINITY, "token {i} masked");
            }
        }
    }

    #[test]
    fn a_full_word_is_left_alone_and_the_tail_past_the_mask_is_masked() {
        let all: Vec<u32> = (0..64).collect();
        let mut logits = vec![1.0f32; 80];
        mask_logits(&vob(64, &all), &mut logits);
        assert!(logits[..64].iter().all(|l| *l == 1.0));
        assert!(logits[64..].iter().all(|l| *l == f32::NEG_INFINITY));
    }

    #[test]
    fn an_empty_mask_leaves_the_row() {
        let mut logits = vec![0.5f32; 10];
        mask_logits(&vob(10, &[]), &mut logits);
        assert!(logits.iter().all(|l| *l == 0.5));
    }
}
