//! A constrained reply's thinking block: a reasoning model thinks freely first, and its
//! grammar applies from the token after the one that completes `</think>` on (the close
//! tag is matched in the tokens' bytes, however they spell it). The reply may open the
//! block only as its first token (or the prompt opened it); a reply that starts
//! otherwise is under its grammar from the first token.

use tessera_protocol::ThinkingTags;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing sampled yet: the grammar's first tokens, or the opening tag.
    MayOpen,
    /// Inside the block: no grammar.
    Thinking,
    /// After the block, or never in one: the grammar applies.
    Grammar,
}

/// Where a sequence stands with respect to its thinking block.
#[derive(Debug, Clone)]
pub struct ThinkingGate {
    phase: Phase,
    open: Option<u32>,
    close: Vec<u8>,
    /// The end of the block's bytes so far, long enough to hold a split close tag.
    tail: Vec<u8>,
}

impl ThinkingGate {
    pub fn new(tags: &ThinkingTags) -> Self {
        let phase = match (tags.starts_open, tags.open) {
            _ if tags.close.is_empty() => Phase::Grammar,
            (true, _) => Phase::Thinking,
            (false, Some(_)) => Phase::MayOpen,
            (false, None) => Phase::Grammar,
        };
        ThinkingGate {
            phase,
            open: tags.open,
            close: tags.close.as_bytes().to_vec(),
            tail: Vec::new(),
        }
    }

    /// Whether the grammar masks the next token (with the opening tag allowed besides,
    /// see [`ThinkingGate::may_open`]).
    pub fn grammar_masks(&self) -> bool {
        self.phase != Phase::Thinking
    }

    /// The opening tag, while the next token may open the block.
    pub fn may_open(&self) -> Option<u32> {
        self.open.filter(|_| self.phase == Phase::MayOpen)
    }

    /// Records the next token, whose text `bytes` gives (asked for only inside the
    /// block); returns whether the grammar consumes it.
    pub fn accept(&mut self, token: u32, bytes: impl FnOnce() -> Vec<u8>) -> bool {
        match self.phase {
            Phase::MayOpen if Some(token) == self.open => {
                self.phase = Phase::Thinking;
                false
            }
            Phase::MayOpen | Phase::Grammar => {
                self.phase = Phase::Grammar;
                true
            }
            Phase::Thinking => {
                self.tail.extend_from_slice(&bytes());
                if self.tail.windows(self.close.len()).any(|w| w == self.close) {
                    self.phase = Phase::Grammar;
                    self.tail.clear();
                } else {
                    let keep = self.close.len().saturating_sub(1);
                    let cut = self.tail.len().saturating_sub(keep);
                    self.tail.drain(..cut);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(open: Option<u32>, starts_open: bool) -> ThinkingTags {
        ThinkingTags {
            open,
            close: "</think>".into(),
            starts_open,
        }
    }

    #[test]
    fn the_grammar_starts_after_the_close_tag_however_it_is_spelled() {
        let mut gate = ThinkingGate::new(&tags(Some(1), false));
        assert_eq!(gate.may_open(), Some(1));
        assert!(!gate.accept(1, || b"<think>".to_vec()));
        assert!(!gate.grammar_masks());
        for text in ["a", "</", "thin", "k", "?", "\n</th"] {
            assert!(!gate.accept(5, || text.as_bytes().to_vec()), "{text}");
        }
        assert!(
            !gate.accept(5, || b"ink>\n".to_vec()),
            "the token completing the tag is thinking"
        );
        assert!(gate.grammar_masks());
        assert_eq!(gate.may_open(), None);
        assert!(
            gate.accept(1, || b"<think>".to_vec()),
            "the opening tag later is grammar text"
        );
    }

    #[test]
    fn a_reply_that_does_not_open_the_block_is_under_its_grammar() {
        let mut gate = ThinkingGate::new(&tags(Some(1), false));
        assert!(gate.accept(3, || b"{".to_vec()));
        assert!(gate.accept(7, || b"</think>".to_vec()));
        assert!(gate.grammar_masks());
        // Without a one-token opening tag, only a prompt that opened the block thinks.
        let gate = ThinkingGate::new(&tags(None, false));
        assert!(gate.grammar_masks() && gate.may_open().is_none());
        let mut gate = ThinkingGate::new(&tags(None, true));
        assert!(!gate.grammar_masks());
        assert!(!gate.accept(7, || b"</think>".to_vec()));
        assert!(gate.grammar_masks());
    }
}
