//! Builds a Hugging Face `tokenizers::Tokenizer` from a [`GgufVocab`].
//!
//! Only byte-level BPE (`tokenizer.ggml.model = gpt2`) is supported. The pipeline is the
//! one a tokenizer.json for the same model would describe:
//!
//! 1. added tokens: control tokens (type 3) are special added tokens, user-defined tokens
//!    (type 4) plain added tokens; both are matched in the input text before anything else
//!    runs, so `<|im_start|>` written in a rendered chat prompt becomes its id;
//! 2. pre-tokenizer: the split regexes llama.cpp uses for `tokenizer.ggml.pre`, applied in
//!    order, each piece kept (`Isolated`), then the byte-to-unicode mapping of GPT-2;
//! 3. model: BPE over the vocabulary and merges, no unknown token;
//! 4. decoder: byte-level (unicode back to bytes).
//!
//! BOS/EOS insertion is not done here: [`crate::Tokenizer`] adds them from the GGUF flags.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Result, TokenizerError};
use crate::gguf_vocab::{GgufVocab, TokenType};

/// GPT-2's split pattern (the one Hugging Face's `ByteLevel(use_regex=True)` applies).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's pattern: case-insensitive contractions, numbers in groups of up to three.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pattern: like Llama 3's, but every digit on its own.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's pattern (o200k; gpt-oss's tokenizer): words split before capitals that
/// follow lowercase, contractions kept with their word, numbers in groups of up to three,
/// runs of punctuation with a trailing newline or slash.
const GPT4O_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One digit at a time: applied before GPT-2's pattern by the StarCoder family (SmolLM).
const SINGLE_DIGIT_PATTERN: &str = r"\p{N}";

/// How a named GGUF pre-tokenizer splits text before BPE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied one after the other; every match and every gap becomes a piece.
    pub(crate) patterns: Vec<&'static str>,
    /// Look a whole piece up in the vocabulary before merging (Llama 3 tokenizer.json).
    pub(crate) ignore_merges: bool,
}

impl PreTokenizerSpec {
    /// The split rules for `tokenizer.ggml.pre`. A missing name means GPT-2's rules, as in
    /// llama.cpp; an unknown name is an error rather than a silent guess, because a wrong
    /// split changes the ids the model sees.
    pub(crate) fn for_name(pre: Option<&str>) -> Result<Self> {
        let (patterns, ignore_merges) = match pre.unwrap_or("default") {
            "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" => (vec![GPT2_PATTERN], false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva" => (vec![SINGLE_DIGIT_PATTERN, GPT2_PATTERN], false),
            // GLM-4 and GLM-4.5 split as Llama 3 does (llama.cpp's CHATGLM4 rules), the
            // older ChatGLM vocabularies without the whole-piece lookup.
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "glm4" | "glm5" => {
                (vec![LLAMA3_PATTERN], true)
            }
            "chatglm-bpe" => (vec![LLAMA3_PATTERN], false),
            "qwen2" | "qwen2.5" | "qwen-2.5" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => {
                (vec![QWEN2_PATTERN], false)
            }
            // MiniMax-M2's tokenizer.json splits with o200k's pattern (llama.cpp's
            // MINIMAX_M2 rules are the same regex).
            "gpt-4o" | "minimax-m2" => (vec![GPT4O_PATTERN], false),
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        };
        Ok(PreTokenizerSpec {
            patterns,
            ignore_merges,
        })
    }
}

/// Builds the `tokenizers` pipeline for a byte-level BPE GGUF vocabulary.
pub(crate) fn build_backend(vocab: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    if vocab.model != "gpt2" {
        return Err(TokenizerError::UnsupportedModel(vocab.model.clone()));
    }
    let spec = PreTokenizerSpec::for_name(vocab.pre.as_deref())?;

    let token_ids = token_ids(vocab)?;
    let merges = parse_merges(&vocab.merges)?;
    // Every merge must produce a token of the vocabulary. `tokenizers` reports that as an
    // error too, but only after copying the pair into a buffer sized by the longest token,
    // which panics when the pair is longer: a malformed file must get an error instead.
    for (i, (a, b)) in merges.iter().enumerate() {
        let merged = format!("{a}{b}");
        if !token_ids.contains_key(a)
            || !token_ids.contains_key(b)
            || !token_ids.contains_key(&merged)
        {
            return Err(TokenizerError::InvalidMetadata {
                key: "tokenizer.ggml.merges".to_string(),
                reason: format!("merge {i} `{a} {b}` uses or makes a token outside the vocabulary"),
            });
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(token_ids, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Backend(format!("building BPE from GGUF vocab: {e}")))?;

    let mut pre_tokenizers = Vec::with_capacity(spec.patterns.len() + 1);
    for pattern in &spec.patterns {
        let split = Split::new(
            SplitPattern::Regex((*pattern).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )?;
        pre_tokenizers.push(PreTokenizerWrapper::Split(split));
    }
    pre_tokenizers.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(
        pre_tokenizers,
    ))));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));

    add_vocab_tokens(&mut tokenizer, vocab)?;
    Ok(tokenizer)
}

/// Token text to id. On duplicate texts the last id wins, as in llama.cpp's and
/// transformers' text lookups; earlier duplicates stay reachable by id only.
pub(crate) fn token_ids(vocab: &GgufVocab) -> Result<Vocab> {
    let mut ids = Vocab::default();
    ids.reserve(vocab.tokens.len());
    for (id, token) in vocab.tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| TokenizerError::InvalidMetadata {
            key: "tokenizer.ggml.tokens".to_string(),
            reason: "more than u32::MAX tokens".to_string(),
        })?;
        ids.insert(token.clone(), id);
    }
    Ok(ids)
}

/// Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain
/// added tokens, both matched in the text before anything else. Existing vocabulary
/// entries keep their ids: the added vocabulary only records which texts to match.
pub(crate) fn add_vocab_tokens(
    tokenizer: &mut tokenizers::Tokenizer,
    vocab: &GgufVocab,
) -> Result<()> {
    let mut special = Vec::new();
    let mut user_defined = Vec::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        match vocab.token_type(id) {
            TokenType::Control => special.push(AddedToken::from(token.clone(), true)),
            TokenType::UserDefined => {
                user_defined.push(AddedToken::from(token.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    tokenizer.add_special_tokens(special)?;
    tokenizer.add_tokens(user_defined)?;
    Ok(())
}

/// The character byte-level BPE writes for byte `b` (GPT-2's mapping: printable bytes
/// stand for themselves, the others for 256 + their rank among them).
fn byte_symbol(b: u8) -> char {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|x| !printable(*x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Bytes whose byte-level symbol is not a token of the vocabulary: a BPE with no unknown
/// token would drop them from any text that holds them.
pub(crate) fn unrepresentable_bytes(vocab: &GgufVocab) -> [bool; 256] {
    let present: std::collections::HashSet<&str> =
        vocab.tokens.iter().map(String::as_str).collect();
    let mut missing = [false; 256];
    for (b, m) in missing.iter_mut().enumerate() {
        let symbol = byte_symbol(b as u8).to_string();
        *m = !present.contains(symbol.as_str());
    }
    missing
}

/// Splits GGUF merges (`"left right"`) into pairs. The separator is the first space after
/// the first byte, so a left part that is itself a space-like symbol stays intact.
fn parse_merges(merges: &[String]) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .enumerate()
        .map(|(i, merge)| {
            let split_at = merge
                .char_indices()
                .skip(1)
                .find(|(_, c)| *c == ' ')
                .map(|(pos, _)| pos);
            match split_at {
                Some(pos) => Ok((merge[..pos].to_string(), merge[pos + 1..].to_string())),
                None => Err(TokenizerError::InvalidMetadata {
                    key: "tokenizer.ggml.merges".to_string(),
                    reason: format!("merge {i} `{merge}` has no space separator"),
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimax_m2_splits_as_gpt_4o() {
        assert_eq!(
            PreTokenizerSpec::for_name(Some("minimax-m2")).ok(),
            PreTokenizerSpec::for_name(Some("gpt-4o")).ok()
        );
    }

    #[test]
    fn byte_symbols_follow_gpt2() {
        assert_eq!(byte_symbol(b'a'), 'a');
        assert_eq!(byte_symbol(b' '), 'Ġ');
        assert_eq!(byte_symbol(b'\n'), 'Ċ');
        assert_eq!(byte_symbol(0xF2), 'ò');
        assert_eq!(byte_symbol(0), 'Ā');
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_symbol).collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn a_merge_longer_than_any_token_is_an_error_not_a_panic() {
        // Found by fuzzing: one-byte tokens and a merge making a two-byte one, which
        // `tokenizers`' builder indexes past its buffer for.
        let vocab = GgufVocab {
            model: "gpt2".to_string(),
            tokens: vec!["a".to_string(), "b".to_string()],
            merges: vec!["a b".to_string()],
            ..GgufVocab::default()
        };
        let err = build_backend(&vocab)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("outside the vocabulary"), "{err}");
    }

    #[test]
    fn merges_split_on_first_inner_space() {
        let merges = vec!["Ġ t".to_string(), "a b".to_string()];
        let parsed = parse_merges(&merges).unwrap();
        assert_eq!(parsed[0], ("Ġ".to_string(), "t".to_string()));
        assert_eq!(parsed[1], ("a".to_string(), "b".to_string()));
        assert!(parse_merges(&["ab".to_string()]).is_err());
    }

    #[test]
    fn unknown_pre_tokenizer_is_an_error() {
        assert!(PreTokenizerSpec::for_name(Some("no-such-pre")).is_err());
        assert_eq!(
            PreTokenizerSpec::for_name(Some("smollm")).unwrap().patterns,
            vec![SINGLE_DIGIT_PATTERN, GPT2_PATTERN]
        );
        assert_eq!(
            PreTokenizerSpec::for_name(None).unwrap().patterns,
            vec![GPT2_PATTERN]
        );
        // GLM's files: Llama 3's split, with its whole-piece lookup for glm4.
        assert_eq!(
            PreTokenizerSpec::for_name(Some("glm4")).unwrap(),
            PreTokenizerSpec::for_name(Some("llama-bpe")).unwrap()
        );
        assert!(
            !PreTokenizerSpec::for_name(Some("chatglm-bpe"))
                .unwrap()
                .ignore_merges
        );
    }
}
