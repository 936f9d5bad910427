//! A tiny hand-made GGUF vocabulary: pre-tokenizer rules per `tokenizer.ggml.pre`, token
//! types, BOS insertion and metadata validation, without a model file.

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

use std::collections::HashMap;

use tessera_tokenizer::{GgufVocab, MetaValue, Tokenizer, TokenizerError};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

const EXTRA: &[&str] = &["12", "123", "45", "he", "hel", "hell", "hello"];
const MERGES: &[&str] = &["1 2", "12 3", "4 5", "h e", "he l", "hel l", "hell o"];

/// Metadata of a byte-level BPE vocabulary: the 256 byte symbols, a few merged tokens,
/// `<s>` (control, BOS), `<|ctl|>` (control) and `<tool>` (user-defined).
fn metadata(pre: &str) -> HashMap<String, MetaValue> {
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort();
    let mut tokens: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
    tokens.extend(EXTRA.iter().map(|s| s.to_string()));
    let mut types = vec![1i64; tokens.len()];
    for (text, kind) in [("<s>", 3), ("<|ctl|>", 3), ("<tool>", 4)] {
        tokens.push(text.to_string());
        types.push(kind);
    }
    let bos = tokens.len() as i64 - 3;
    let strings =
        |items: Vec<String>| MetaValue::Array(items.into_iter().map(MetaValue::String).collect());
    HashMap::from([
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".into(), MetaValue::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(types.into_iter().map(MetaValue::Int).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            strings(MERGES.iter().map(|s| s.to_string()).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::Int(bos)),
        (
            "tokenizer.ggml.eos_token_id".into(),
            MetaValue::Int(bos + 1),
        ),
        ("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(true)),
    ])
}

fn vocab_from(meta: &HashMap<String, MetaValue>) -> Result<GgufVocab, TokenizerError> {
    GgufVocab::from_metadata(|key| meta.get(key).cloned())
}

fn tokenizer(pre: &str) -> Tokenizer {
    Tokenizer::from_gguf(&vocab_from(&metadata(pre)).unwrap()).unwrap()
}

fn pieces(tokenizer: &Tokenizer, text: &str) -> Vec<String> {
    tokenizer
        .encode(text, false)
        .unwrap()
        .into_iter()
        .map(|id| tokenizer.id_to_token(id).unwrap())
        .collect()
}

#[test]
fn digits_follow_the_named_pre_tokenizer() {
    // StarCoder family (SmolLM) and Qwen2: one digit per piece, so no digit merges apply.
    assert_eq!(
        pieces(&tokenizer("smollm"), "12345"),
        ["1", "2", "3", "4", "5"]
    );
    assert_eq!(
        pieces(&tokenizer("qwen2"), "12345"),
        ["1", "2", "3", "4", "5"]
    );
    // Llama 3: groups of up to three digits; GPT-2: one piece, merged by BPE.
    assert_eq!(pieces(&tokenizer("llama-bpe"), "12345"), ["123", "45"]);
    assert_eq!(pieces(&tokenizer("gpt2"), "12345"), ["123", "45"]);
}

#[test]
fn control_and_user_defined_tokens() {
    let t = tokenizer("smollm");
    let ids = t.encode("<|ctl|>hello<tool>", false).unwrap();
    assert_eq!(
        pieces(&t, "<|ctl|>hello<tool>"),
        ["<|ctl|>", "hello", "<tool>"]
    );
    assert!(t.is_special(ids[0]) && !t.is_special(ids[2]));
    assert_eq!(t.decode(&ids, false).unwrap(), "<|ctl|>hello<tool>");
    // Control tokens are skipped, user-defined tokens are text.
    assert_eq!(t.decode(&ids, true).unwrap(), "hello<tool>");
    assert_eq!(
        pieces(&t, "hello world"),
        ["hello", "Ġ", "w", "o", "r", "l", "d"]
    );
}

#[test]
fn bos_is_added_when_the_file_says_so() {
    let t = tokenizer("smollm");
    let bos = t.bos_token_id().unwrap();
    assert_eq!(t.token_to_id("<s>"), Some(bos));
    let with = t.encode("hello", true).unwrap();
    assert_eq!(with[0], bos);
    assert_eq!(&with[1..], t.encode("hello", false).unwrap().as_slice());
    assert_eq!(t.eos_token_ids(), &[bos + 1]);
    assert_eq!(t.special_token_strings().bos_token.as_deref(), Some("<s>"));
    assert!(matches!(
        t.chat_template(),
        Err(TokenizerError::NoChatTemplate)
    ));
}

#[test]
fn unsupported_inputs_are_named() {
    let err = Tokenizer::from_gguf(&vocab_from(&metadata("no-such-pre")).unwrap()).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedPreTokenizer(ref p) if p == "no-such-pre"),
        "{err}"
    );

    let mut meta = metadata("smollm");
    meta.insert(
        "tokenizer.ggml.model".into(),
        MetaValue::String("t5".into()),
    );
    let err = Tokenizer::from_gguf(&vocab_from(&meta).unwrap()).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedModel(ref m) if m == "t5"),
        "{err}"
    );
}

#[test]
fn metadata_is_validated() {
    let mut meta = metadata("smollm");
    meta.remove("tokenizer.ggml.tokens");
    let err = vocab_from(&meta).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");

    let mut meta = metadata("smollm");
    meta.insert(
        "tokenizer.ggml.eos_token_id".into(),
        MetaValue::Int(1_000_000),
    );
    let err = vocab_from(&meta).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");

    let mut meta = metadata("smollm");
    meta.insert(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array(vec![MetaValue::Int(1)]),
    );
    let err = vocab_from(&meta).unwrap_err();
    assert!(err.to_string().contains("token_type"), "{err}");

    let mut meta = metadata("smollm");
    meta.insert("tokenizer.ggml.pre".into(), MetaValue::Int(3));
    let err = vocab_from(&meta).unwrap_err();
    assert!(err.to_string().contains("expected a string"), "{err}");
}

#[test]
fn fill_in_the_middle_ids_the_file_names() {
    let base = metadata("llama-bpe");
    let id_of = |tokenizer: &Tokenizer, text: &str| tokenizer.token_to_id(text).unwrap();
    let plain = tokenizer("llama-bpe");
    assert!(plain.fim_tokens().is_none());
    assert!(matches!(
        plain.encode_infill("hello", "12"),
        Err(TokenizerError::NoFimTokens)
    ));
    let (pre, suf, mid) = (
        id_of(&plain, "<|ctl|>"),
        id_of(&plain, "<tool>"),
        id_of(&plain, "45"),
    );
    // llama.cpp's keys, then the older ones its converter wrote for CodeLlama.
    for names in [
        ["fim_pre", "fim_suf", "fim_mid"],
        ["prefix", "suffix", "middle"],
    ] {
        let mut meta = base.clone();
        for (name, id) in names.iter().zip([pre, suf, mid]) {
            meta.insert(
                format!("tokenizer.ggml.{name}_token_id"),
                MetaValue::Int(i64::from(id)),
            );
        }
        let t = Tokenizer::from_gguf(&vocab_from(&meta).unwrap()).unwrap();
        let bos = t.bos_token_id().unwrap();
        let mut want = vec![bos, pre];
        want.extend(t.encode("hello", false).unwrap());
        want.push(suf);
        want.extend(t.encode("12", false).unwrap());
        want.push(mid);
        assert_eq!(t.encode_infill("hello", "12").unwrap(), want, "{names:?}");
    }
    // Two of three name no layout; an id past the vocabulary is refused by key.
    let mut meta = base.clone();
    meta.insert(
        "tokenizer.ggml.fim_pre_token_id".into(),
        MetaValue::Int(i64::from(pre)),
    );
    meta.insert(
        "tokenizer.ggml.fim_suf_token_id".into(),
        MetaValue::Int(i64::from(suf)),
    );
    let t = Tokenizer::from_gguf(&vocab_from(&meta).unwrap()).unwrap();
    assert!(t.fim_tokens().is_none());
    meta.insert(
        "tokenizer.ggml.fim_mid_token_id".into(),
        MetaValue::Int(1 << 20),
    );
    match vocab_from(&meta) {
        Err(TokenizerError::InvalidMetadata { key, .. }) => {
            assert_eq!(key, "tokenizer.ggml.fim_mid_token_id")
        }
        other => panic!("{other:?}"),
    }
}
