//! Gemma 3's official tokenizer.json (a SentencePiece vocabulary with byte fallback) and
//! its `<start_of_turn>` chat template against transformers
//! (tests/fixtures/tokenizer/gemma3_*.json). The tokenizer is fetched into the cache by
//! `scripts/make-token-fixtures fetch`; without it these tests skip.

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use std::sync::Arc;

use common::{cases, gemma3_dir, gemma3_gguf_path, ids_of, load_fixture, vocab_of};
use tessera_tokenizer::Tokenizer;

fn gemma3() -> Option<Arc<Tokenizer>> {
    let dir = gemma3_dir()?;
    Some(Arc::new(Tokenizer::from_hf_dir(&dir).unwrap()))
}

/// The tokenizer the GGUF file's own metadata describes (SentencePiece pieces and scores).
fn gemma3_from_gguf() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_gguf(&vocab_of(&gemma3_gguf_path())).unwrap())
}

#[test]
fn gemma3_ids_and_decode_equal_transformers() {
    let Some(tokenizer) = gemma3() else { return };
    ids_and_decode_equal_transformers(tokenizer);
}

#[test]
fn gemma3_gguf_ids_and_decode_equal_transformers() {
    ids_and_decode_equal_transformers(gemma3_from_gguf());
}

#[test]
fn gemma3_gguf_chat_prompts_encode_as_transformers_does() {
    let tokenizer = gemma3_from_gguf();
    assert_eq!(tokenizer.bos_token_id(), Some(2));
    // `<end_of_turn>` ends a reply though the file's EOS is `<eos>`.
    assert!(tokenizer.eos_token_ids().contains(&106));
    assert!(tokenizer.eos_token_ids().contains(&1));
    let fixture = load_fixture("gemma3_chat.json");
    for case in cases(&fixture) {
        let name = case["name"].as_str().unwrap();
        assert_eq!(
            tokenizer
                .encode(case["rendered"].as_str().unwrap(), false)
                .unwrap(),
            ids_of(&case["ids"]),
            "{name}"
        );
    }
}

/// transformers' vocabulary also counts `<image_soft_token>` (262144), which the GGUF's
/// text-only vocabulary lacks.
fn ids_and_decode_equal_transformers(tokenizer: Arc<Tokenizer>) {
    let fixture = load_fixture("gemma3_tokenize.json");
    let hf_vocab = fixture["vocab_size"].as_u64().unwrap() as usize;
    assert!(
        [hf_vocab, hf_vocab - 1].contains(&tokenizer.vocab_size()),
        "vocabulary of {}",
        tokenizer.vocab_size()
    );
    common::ids_and_decode_equal_transformers(&tokenizer, &fixture);
}

#[test]
fn gemma3_chat_template_equals_transformers() {
    let Some(tokenizer) = gemma3() else { return };
    // <end_of_turn>, the declared eos of the chat tokenizer; <bos> starts every chat.
    assert!(tokenizer.eos_token_ids().contains(&106));
    assert_eq!(tokenizer.bos_token_id(), Some(2));
    let fixture = load_fixture("gemma3_chat.json");
    common::chats_render_as_transformers(&tokenizer, &fixture);
}
