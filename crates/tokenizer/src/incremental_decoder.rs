//! `IncrementalDecoder`: turns a stream of token ids into a stream of text deltas.
//!
//! Decoding one token at a time is wrong for two reasons: a token can carry part of a
//! multi-byte UTF-8 character (byte-level BPE splits emoji and CJK across tokens), and some
//! decoders change a token's text depending on what precedes it (leading-space rules).
//! So the decoder keeps two offsets into the ids it has seen:
//!
//! * `prefix_offset`: start of a short window of already-emitted tokens used as context;
//! * `read_offset`: end of the emitted tokens.
//!
//! Each push decodes `ids[prefix_offset..read_offset]` and `ids[prefix_offset..]`; the new
//! text is what the second adds to the first. While that text ends in U+FFFD (an incomplete
//! UTF-8 sequence, as the backend decodes lossily) nothing is emitted and the offsets stay,
//! so the next token completes the character. [`IncrementalDecoder::finish`] emits whatever
//! is still held back, replacement characters included, when generation ends.
//!
//! Invariant: the concatenation of all returned deltas equals `decode(all ids)` whenever
//! that text does not end mid-character.
//!
//! Special tokens named by [`IncrementalDecoder::keeping`] are written out even when
//! special tokens are skipped: a tool-call parser needs the markers (`[TOOL_CALLS]`,
//! `[ARGS]`) that split a reply, while end-of-turn tokens must stay out of the text.

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::Result;
use crate::tokenizer::Tokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// Streaming detokenizer for one sequence.
#[derive(Debug)]
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// Special ids written out although special tokens are skipped.
    kept: HashSet<u32>,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder for a new sequence. `skip_special_tokens` as in [`Tokenizer::decode`].
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            tokenizer,
            skip_special_tokens,
            kept: HashSet::new(),
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Writes out the special tokens `ids` as their text, in place, even when special
    /// tokens are skipped.
    pub fn keeping(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        self.kept.extend(ids);
        self
    }

    /// Adds one generated id; returns the text that can be shown now (maybe empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        if self.skip_special_tokens && self.kept.contains(&id) {
            // What is held back goes out before the marker (a character the marker cut
            // stays cut). The marker joins the context window, where decoding skips it,
            // so the text after it decodes as if it were not there.
            let mut text = self.finish()?;
            text.push_str(&self.tokenizer.decode(&[id], false)?);
            self.ids.push(id);
            self.read_offset = self.ids.len();
            return Ok(text);
        }
        self.ids.push(id);
        let window = &self.ids[self.prefix_offset..];
        let prefix_text = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full_text = self.decode(window)?;
        if full_text.ends_with(REPLACEMENT) {
            // Part of a character: wait for the bytes that complete it.
            return Ok(String::new());
        }
        let delta = text_after(&prefix_text, &full_text);
        if delta.is_empty() {
            // A token that decodes to nothing (a skipped special token): keep the window
            // as it is, there is nothing to emit.
            self.read_offset = self.ids.len();
            return Ok(String::new());
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta)
    }

    /// Emits whatever is still held back (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> Result<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix_text = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full_text = self.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(text_after(&prefix_text, &full_text))
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        self.tokenizer.decode(ids, self.skip_special_tokens)
    }
}

/// The part of `full` after the text it shares with `prefix`. Normally `full` starts with
/// `prefix`; if a decoder rewrote the tail of the context, fall back to the longest common
/// prefix at a character boundary so nothing is emitted twice.
fn text_after(prefix: &str, full: &str) -> String {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest.to_string();
    }
    let common = prefix
        .char_indices()
        .zip(full.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| prefix.len().min(full.len()));
    full.get(common..).unwrap_or_default().to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// SmolLM2's tokenizer from the repository's fixtures.
    fn smollm2() -> Arc<Tokenizer> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tokenizer/smollm2-hf");
        Arc::new(Tokenizer::from_hf_dir(&dir).unwrap())
    }

    fn streamed(decoder: &mut IncrementalDecoder, ids: &[u32]) -> String {
        let mut text = String::new();
        for &id in ids {
            text.push_str(&decoder.push(id).unwrap());
        }
        text.push_str(&decoder.finish().unwrap());
        text
    }

    #[test]
    fn kept_specials_are_written_where_they_stand_and_others_skipped() {
        let tok = smollm2();
        let start = tok.token_to_id("<|im_start|>").unwrap();
        let end = tok.token_to_id("<|im_end|>").unwrap();
        assert!(tok.is_special(start) && tok.is_special(end));
        let mut ids = tok.encode("Hello wörld", false).unwrap();
        ids.push(start);
        ids.extend(tok.encode(" call{\"a\": 1}", false).unwrap());
        ids.push(end);
        let mut keeping = IncrementalDecoder::new(Arc::clone(&tok), true).keeping([start]);
        assert_eq!(
            streamed(&mut keeping, &ids),
            "Hello wörld<|im_start|> call{\"a\": 1}"
        );
        let mut plain = IncrementalDecoder::new(tok, true);
        assert_eq!(streamed(&mut plain, &ids), "Hello wörld call{\"a\": 1}");
    }

    #[test]
    fn text_after_prefix() {
        assert_eq!(text_after("ab", "abc"), "c");
        assert_eq!(text_after("", "é"), "é");
        assert_eq!(text_after("a\u{FFFD}", "aé!"), "é!");
    }
}
