//! Builds a Hugging Face `tokenizers::Tokenizer` for a SentencePiece GGUF vocabulary
//! (`tokenizer.ggml.model = llama`: Llama 2, Gemma, Mistral's older models).
//!
//! SentencePiece BPE merges, at every step, the adjacent pair whose joined piece has the
//! highest score (leftmost first among equals), and spells a character without a piece as
//! its UTF-8 bytes (`<0xNN>` pieces). The same result comes from a `tokenizers` BPE whose
//! merges are every split of a piece into two pieces, ranked by the joined piece's score,
//! with byte fallback on: the pipeline a tokenizer.json for such a model describes.
//!
//! 1. added tokens: control pieces (type 3) special, user-defined pieces (type 4) plain,
//!    matched in the text before anything else;
//! 2. normalizer: spaces become `▁`, with one `▁` before the text when
//!    `tokenizer.ggml.add_space_prefix` says so;
//! 3. model: BPE with byte fallback, unknown characters fused into one `<unk>`;
//! 4. decoder: `▁` back to spaces, byte pieces back to bytes, the leading space of the
//!    prefix dropped.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use crate::error::{Result, TokenizerError};
use crate::gguf_backend::{add_vocab_tokens, token_ids};
use crate::gguf_vocab::{GgufVocab, TokenType};

/// SentencePiece's visible space.
const SPACE: &str = "\u{2581}";

/// Builds the `tokenizers` pipeline for a SentencePiece GGUF vocabulary.
pub(crate) fn build_spm_backend(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    let ids = token_ids(vocab)?;
    let merges = merges_by_score(vocab, &ids);
    let mut bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = vocab
        .unknown_token_id
        .and_then(|id| vocab.tokens.get(id as usize))
    {
        bpe = bpe.unk_token(unk.clone());
    }
    let bpe = bpe
        .build()
        .map_err(|e| TokenizerError::Backend(format!("building SentencePiece BPE: {e}")))?;

    let prefix = vocab.add_space_prefix.unwrap_or(false);
    let mut normalizers = Vec::with_capacity(2);
    if prefix {
        normalizers.push(NormalizerWrapper::Prepend(Prepend::new(SPACE.to_string())));
    }
    normalizers.push(NormalizerWrapper::Replace(Replace::new(" ", SPACE)?));
    let mut decoders = vec![
        DecoderWrapper::Replace(Replace::new(SPACE, " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(NormalizerWrapper::Sequence(NormalizerSequence::new(
        normalizers,
    ))))?;
    tokenizer.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
        decoders,
    ))));

    add_vocab_tokens(&mut tokenizer, vocab)?;
    Ok(tokenizer)
}

/// Every split of a normal or user-defined piece into two pieces, highest joined score
/// first (then lower joined id, then lower left and right ids, so the order is total).
/// Without scores, a lower id ranks first, as SentencePiece orders its pieces.
fn merges_by_score(vocab: &GgufVocab, ids: &Vocab) -> Vec<(String, String)> {
    let score = |id: u32| -> f32 {
        vocab
            .scores
            .get(id as usize)
            .copied()
            .unwrap_or(-(id as f32))
    };
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if !matches!(
            vocab.token_type(id),
            TokenType::Normal | TokenType::UserDefined
        ) {
            continue;
        }
        let Some(&joined) = ids.get(piece) else {
            continue;
        };
        // A duplicate text is merged into once, under its surviving id.
        if joined as usize != id {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            if let (Some(&left), Some(&right)) = (ids.get(&piece[..at]), ids.get(&piece[at..])) {
                ranked.push((score(joined), joined, left, right));
            }
        }
    }
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    let text = |id: u32| vocab.tokens[id as usize].clone();
    ranked
        .into_iter()
        .map(|(_, _, left, right)| (text(left), text(right)))
        .collect()
}

/// Bytes a SentencePiece vocabulary cannot spell: no `<0xNN>` piece and no unknown piece
/// to stand for them.
pub(crate) fn unrepresentable_spm_bytes(vocab: &GgufVocab) -> [bool; 256] {
    let mut missing = [false; 256];
    if vocab.unknown_token_id.is_some() {
        return missing;
    }
    let present: std::collections::HashSet<&str> =
        vocab.tokens.iter().map(String::as_str).collect();
    for (b, m) in missing.iter_mut().enumerate() {
        *m = !present.contains(format!("<0x{b:02X}>").as_str());
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(pieces: &[(&str, f32)]) -> GgufVocab {
        GgufVocab {
            model: "llama".to_string(),
            tokens: pieces.iter().map(|(p, _)| p.to_string()).collect(),
            scores: pieces.iter().map(|(_, s)| *s).collect(),
            unknown_token_id: Some(0),
            ..GgufVocab::default()
        }
    }

    fn encode(v: &GgufVocab, text: &str) -> Vec<u32> {
        let t = build_spm_backend(v).expect("build");
        t.encode(text, false).expect("encode").get_ids().to_vec()
    }

    #[test]
    fn the_highest_scoring_pair_merges_first() {
        // "abc": "ab" outscores "bc", so a+b first, then ab+c.
        let v = vocab(&[
            ("<unk>", 0.0),
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -2.0),
            ("bc", -3.0),
            ("abc", -4.0),
        ]);
        assert_eq!(encode(&v, "abc"), vec![6]);
        assert_eq!(encode(&v, "ab"), vec![4]);
        // Without "abc": "ab" + "c", never "a" + "bc".
        let mut v2 = v.clone();
        v2.tokens.truncate(6);
        v2.scores.truncate(6);
        assert_eq!(encode(&v2, "abc"), vec![4, 3]);
        // Scores reversed: "bc" wins.
        let mut v3 = v2.clone();
        v3.scores[4] = -3.0;
        v3.scores[5] = -2.0;
        assert_eq!(encode(&v3, "abc"), vec![1, 5]);
    }

    #[test]
    fn spaces_become_the_visible_space_and_a_prefix_when_asked() {
        let mut v = vocab(&[("<unk>", 0.0), ("▁", -1.0), ("a", -1.0), ("▁a", -2.0)]);
        assert_eq!(encode(&v, "a a"), vec![2, 3]);
        v.add_space_prefix = Some(true);
        assert_eq!(encode(&v, "a a"), vec![3, 3]);
        let t = build_spm_backend(&v).expect("build");
        assert_eq!(t.decode(&[3, 3], false).expect("decode"), "a a");
    }

    #[test]
    fn characters_without_a_piece_fall_back_to_bytes() {
        let mut pieces = vec![("<unk>".to_string(), 0.0), ("a".to_string(), -1.0)];
        pieces.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0)));
        let v = GgufVocab {
            model: "llama".to_string(),
            tokens: pieces.iter().map(|(p, _)| p.clone()).collect(),
            scores: pieces.iter().map(|(_, s)| *s).collect(),
            token_types: (0..pieces.len())
                .map(|i| match i {
                    0 => TokenType::Unknown,
                    1 => TokenType::Normal,
                    _ => TokenType::Byte,
                })
                .collect(),
            unknown_token_id: Some(0),
            ..GgufVocab::default()
        };
        // "é" is C3 A9 in UTF-8: ids 2 + 0xC3 and 2 + 0xA9.
        let ids = encode(&v, "aé");
        assert_eq!(ids, vec![1, 2 + 0xC3, 2 + 0xA9]);
        let t = build_spm_backend(&v).expect("build");
        assert_eq!(t.decode(&ids, false).expect("decode"), "aé");
        assert_eq!(unrepresentable_spm_bytes(&v), [false; 256]);
    }
}
