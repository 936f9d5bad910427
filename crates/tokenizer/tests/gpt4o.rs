//! GGUF files of gpt-oss name their pre-tokenizer `gpt-4o` (o200k). Its vocabulary as
//! llama.cpp's converter writes it (tokens by id, merges, special tokens as control)
//! with that pre-tokenizer must encode text as GPT-4o's official tokenizer.json does.
//! The tokenizer is fetched into the cache by `scripts/make-token-fixtures fetch`;
//! without it these tests skip.

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use std::collections::HashMap;

use serde_json::Value;
use tessera_tokenizer::{GgufVocab, MetaValue, Tokenizer};

/// Text that exercises every branch of the pattern: capitals after lowercase and runs of
/// capitals, contractions in both cases, digit groups, punctuation runs ending in a
/// newline or slash, whitespace runs, other scripts, marks and emoji.
const TEXTS: &[&str] = &[
    "Hello World's HTTPServer isn't DON'T we'll",
    "1234567 + 89 = 1234656; 3.14159e-10",
    "paths/like/this/ and urls: https://example.com/a?b=c&d=e",
    "  leading spaces\n\n\ttabs\r\n  trailing   ",
    "camelCaseWord XMLHttpRequest iPhone McDonald's",
    "Ünïcödé çafé naïve — “quotes” …",
    "日本語のテキストと漢字、한국어 텍스트, العربية, русский текст",
    "emoji 🙂👍🏽 and 🇫🇷 flags",
    "code: fn main() {\n    println!(\"{}\", x?);\n}\n//! doc\n",
    "e\u{301}te\u{301} (combining marks) देवनागरी",
    "!!!???...---***",
];

/// GPT-4o's vocabulary as GGUF metadata with pre-tokenizer `pre`.
fn gguf_vocab(dir: &std::path::Path, pre: &str) -> GgufVocab {
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let mut by_id: HashMap<u64, (String, i64)> = HashMap::new();
    for (token, id) in json["model"]["vocab"].as_object().unwrap() {
        by_id.insert(id.as_u64().unwrap(), (token.clone(), 1));
    }
    for added in json["added_tokens"].as_array().unwrap() {
        let kind = if added["special"].as_bool().unwrap_or(false) {
            3
        } else {
            4
        };
        let id = added["id"].as_u64().unwrap();
        by_id.insert(id, (added["content"].as_str().unwrap().to_string(), kind));
    }
    let n = by_id.keys().max().unwrap() + 1;
    // Ids no token has are unused padding, as llama.cpp's converter fills them.
    let (tokens, types): (Vec<_>, Vec<_>) = (0..n)
        .map(|id| by_id.remove(&id).unwrap_or((format!("[PAD{id}]"), 5)))
        .map(|(t, k)| (MetaValue::String(t), MetaValue::Int(k)))
        .unzip();
    let merges: Vec<MetaValue> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => MetaValue::String(s.clone()),
            pair => MetaValue::String(format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            )),
        })
        .collect();
    let meta: HashMap<String, MetaValue> = HashMap::from([
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".into(), MetaValue::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), MetaValue::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), MetaValue::Array(types)),
        ("tokenizer.ggml.merges".into(), MetaValue::Array(merges)),
        (
            "tokenizer.ggml.add_bos_token".into(),
            MetaValue::Bool(false),
        ),
    ]);
    GgufVocab::from_metadata(|key| meta.get(key).cloned()).unwrap()
}

#[test]
fn gpt_4o_gguf_vocabulary_encodes_as_the_official_tokenizer() {
    let Some(dir) = common::gpt4o_dir() else {
        return;
    };
    let official = Tokenizer::from_hf_dir(&dir).unwrap();
    let gguf = Tokenizer::from_gguf(&gguf_vocab(&dir, "gpt-4o")).unwrap();
    for text in TEXTS {
        let want = official.encode(text, false).unwrap();
        assert_eq!(gguf.encode(text, false).unwrap(), want, "{text:?}");
        assert_eq!(gguf.decode(&want, false).unwrap(), *text, "{text:?}");
    }
    // Llama 3's pattern, close as it is, splits some of the same text otherwise.
    let llama3 = Tokenizer::from_gguf(&gguf_vocab(&dir, "llama3")).unwrap();
    let differ = TEXTS
        .iter()
        .filter(|t| llama3.encode(t, false).unwrap() != official.encode(t, false).unwrap())
        .count();
    assert!(differ > 0, "no text tells the two patterns apart");
}
