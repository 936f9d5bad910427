//! Qwen3's official tokenizer.json and chat template (tools, thinking) against
//! transformers (tests/fixtures/tokenizer/qwen3_*.json). The tokenizer itself is fetched
//! into the cache by `scripts/make-token-fixtures fetch`; without it these tests skip.

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use std::sync::Arc;

use common::{cases, ids_of, load_fixture, qwen3_dir};
use tessera_tokenizer::{ContentFormat, IncrementalDecoder, Tokenizer};

fn qwen3() -> Option<Arc<Tokenizer>> {
    let dir = qwen3_dir()?;
    Some(Arc::new(Tokenizer::from_hf_dir(&dir).unwrap()))
}

#[test]
fn qwen3_ids_and_decode_equal_transformers() {
    let Some(tokenizer) = qwen3() else { return };
    let fixture = load_fixture("qwen3_tokenize.json");
    assert_eq!(
        tokenizer.vocab_size(),
        fixture["vocab_size"].as_u64().unwrap() as usize
    );
    for case in cases(&fixture) {
        let name = case["name"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        assert_eq!(
            tokenizer
                .encode(case["text"].as_str().unwrap(), false)
                .unwrap(),
            ids,
            "{name}"
        );
        assert_eq!(
            tokenizer.decode(&ids, false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{name}"
        );
        let mut decoder = IncrementalDecoder::new(tokenizer.clone(), false);
        let mut streamed = String::new();
        for &id in &ids {
            let delta = decoder.push(id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "{name}: {delta:?}");
            streamed.push_str(&delta);
        }
        streamed.push_str(&decoder.finish().unwrap());
        assert_eq!(streamed, case["text"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn qwen3_chat_template_equals_transformers() {
    let Some(tokenizer) = qwen3() else { return };
    let template = tokenizer.chat_template().unwrap();
    assert_eq!(template.content_format(), ContentFormat::Parts);
    // <|im_end|> (declared eos) and <|endoftext|> (end-of-turn marker).
    assert_eq!(tokenizer.eos_token_ids(), &[151643, 151645]);
    assert_eq!(tokenizer.bos_token_id(), None);
    common::chats_render_as_transformers(&tokenizer, &load_fixture("qwen3_chat.json"));
}
