//! Encoding with a bound on the result: a text that must fit a context of `max_tokens`
//! is refused before it is tokenized when its length alone proves it cannot fit, and
//! otherwise counted piece by piece, stopping as soon as the count is over. Tokenizing a
//! whole text costs about 175 bytes of memory per byte of text (offsets, words, merges);
//! a text of megabytes that could never fit costs a refusal, not gigabytes.

use crate::error::{Result, TokenizerError};
use crate::tokenizer::Tokenizer;

/// Texts up to this size are tokenized whole at once: their cost is small whatever they
/// hold.
const WHOLE_BYTES: usize = 64 << 10;

/// Size of the pieces a long text is counted in.
const PIECE_BYTES: usize = 32 << 10;

/// Tokens a cut between two pieces may add to their count (a word split by the cut, a
/// prefix space added to the second piece).
const SLACK_PER_CUT: usize = 4;

/// A text is counted in pieces before being tokenized whole only past this many bytes
/// per allowed token (ordinary text has about four).
const SUSPICIOUS_BYTES_PER_TOKEN: usize = 8;

impl Tokenizer {
    /// An upper bound on the bytes of input text one token stands for: the longest
    /// token in the vocabulary (each token's text is at least as long as the bytes it
    /// decodes to), four times that when a normalizer may fold several input bytes into
    /// one.
    pub fn max_bytes_per_token(&self) -> usize {
        self.longest_token_bytes() * if self.has_normalizer() { 4 } else { 1 }
    }

    /// `encode(text, add_special_tokens)`, or [`TokenizerError::TooLong`] when the text
    /// is known to have more than `max_tokens` tokens: from its length alone, or from a
    /// count in pieces that stops as soon as it is over. A text within the bound is
    /// encoded exactly as [`Tokenizer::encode`] encodes it (the result may still be a
    /// few tokens over `max_tokens`: the caller compares).
    pub fn encode_within(
        &self,
        text: &str,
        add_special_tokens: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>> {
        let too_long = || TokenizerError::TooLong { max_tokens };
        if text.len() > max_tokens.saturating_mul(self.max_bytes_per_token()) {
            return Err(too_long());
        }
        let suspicious = text.len() > WHOLE_BYTES
            && text.len() > max_tokens.saturating_mul(SUSPICIOUS_BYTES_PER_TOKEN);
        if suspicious {
            let mut counted = 0usize;
            for (cuts, piece) in pieces(text, PIECE_BYTES).enumerate() {
                counted += self.encode(piece, false)?.len();
                if counted > max_tokens + cuts * SLACK_PER_CUT {
                    return Err(too_long());
                }
            }
        }
        self.encode(text, add_special_tokens)
    }

    /// The last `keep` tokens of `encode(text, add_special_tokens)`, tokenizing only as
    /// much of the text's end as `keep` tokens can stand for (and a margin), so a long
    /// text whose prompt is truncated is not tokenized whole.
    pub fn encode_tail(
        &self,
        text: &str,
        add_special_tokens: bool,
        keep: usize,
    ) -> Result<Vec<u32>> {
        let reach = keep
            .saturating_mul(self.max_bytes_per_token())
            .saturating_add(PIECE_BYTES);
        let tail = match text.len().checked_sub(reach) {
            Some(start) => &text[cut_at(text, start)..],
            None => text,
        };
        let ids = self.encode(tail, add_special_tokens)?;
        let skip = ids.len().saturating_sub(keep);
        Ok(ids[skip..].to_vec())
    }
}

/// `text` in pieces of about `size` bytes, each cut where whitespace begins (so words
/// stay whole), or at a character boundary when there is none near.
fn pieces(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= size {
            return Some(std::mem::take(&mut rest));
        }
        let at = cut_at(rest, size);
        let (piece, after) = rest.split_at(at);
        rest = after;
        Some(piece)
    })
}

/// A place at or after byte `from` to cut `text`: the next whitespace within 1 KiB, else
/// the next character boundary.
fn cut_at(text: &str, from: usize) -> usize {
    let bytes = text.as_bytes();
    let limit = (from + 1024).min(bytes.len());
    if let Some(i) = bytes[from..limit].iter().position(u8::is_ascii_whitespace) {
        return from + i;
    }
    (from..=bytes.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tokenizer/smollm2-hf");
        Tokenizer::from_hf_dir(&dir).expect("fixture tokenizer")
    }

    #[test]
    fn pieces_cover_the_text_and_cut_before_whitespace() {
        let text = "alpha beta gamma ".repeat(5000) + "é".repeat(3000).as_str();
        let parts: Vec<&str> = pieces(&text, 1000).collect();
        assert_eq!(parts.concat(), text);
        assert!(parts.len() > 10);
        for p in &parts[1..parts.len() - 8] {
            assert!(p.starts_with(' '), "{:?}", &p[..10]);
        }
    }

    #[test]
    fn a_text_within_the_bound_encodes_exactly_as_encode_does() {
        let t = smollm2();
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(3000);
        let whole = t.encode(&text, true).expect("encode");
        let within = t
            .encode_within(&text, true, whole.len() + 10)
            .expect("within");
        assert_eq!(within, whole);
    }

    #[test]
    fn a_text_over_the_bound_is_refused_early() {
        let t = smollm2();
        // Far longer than the bound can hold: refused by its length.
        let huge = "a".repeat(100 * t.max_bytes_per_token() + 1);
        assert!(matches!(
            t.encode_within(&huge, false, 100),
            Err(TokenizerError::TooLong { max_tokens: 100 })
        ));
        // Within the length bound but over the count (one token a word): refused while
        // counting its pieces.
        let words = "word ".repeat(40_000);
        assert!(words.len() < 20_000 * t.max_bytes_per_token());
        assert!(words.len() > 20_000 * SUSPICIOUS_BYTES_PER_TOKEN);
        assert!(matches!(
            t.encode_within(&words, false, 20_000),
            Err(TokenizerError::TooLong { .. })
        ));
        // Just over the bound by count, in a text short enough to be tokenized whole.
        let few = "word ".repeat(3000);
        let n = t.encode(&few, false).expect("encode").len();
        assert!(t.encode_within(&few, false, n).is_ok());
        assert_eq!(
            t.encode_within(&few, false, n - 1)
                .map(|ids| ids.len())
                .ok(),
            Some(n)
        );
    }

    #[test]
    fn the_tail_is_the_last_tokens_of_the_whole() {
        let t = smollm2();
        let text = "one two three four five six seven eight nine ten. ".repeat(4000);
        let whole = t.encode(&text, true).expect("encode");
        let tail = t.encode_tail(&text, true, 100).expect("tail");
        assert_eq!(tail, whole[whole.len() - 100..]);
        let short = "just a few words";
        let all = t.encode(short, true).expect("encode");
        assert_eq!(t.encode_tail(short, true, 100).expect("tail"), all);
    }
}
