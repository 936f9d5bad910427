//! The incremental decoder over the fixture texts: concatenated deltas equal the full
//! text, and no delta ever carries part of a character (U+FFFD).

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use common::{cases, ids_of, load_fixture, smollm2_both};
use tessera_tokenizer::IncrementalDecoder;

#[test]
fn deltas_concatenate_to_the_text_and_never_split_a_character() {
    let fixture = load_fixture("smollm2_tokenize.json");
    for (path, tokenizer) in smollm2_both() {
        for case in cases(&fixture) {
            let name = case["name"].as_str().unwrap();
            let text = case["text"].as_str().unwrap();
            let ids = ids_of(&case["ids"]);
            let mut decoder = IncrementalDecoder::new(tokenizer.clone(), false);
            let mut streamed = String::new();
            let mut held_back = 0;
            for &id in &ids {
                let delta = decoder.push(id).unwrap();
                assert!(
                    !delta.contains('\u{FFFD}'),
                    "[{path}] {name}: partial char in {delta:?}"
                );
                if delta.is_empty() {
                    held_back += 1;
                }
                streamed.push_str(&delta);
            }
            let tail = decoder.finish().unwrap();
            assert_eq!(
                tail, "",
                "[{path}] {name}: nothing may be left at a character boundary"
            );
            assert_eq!(streamed, text, "[{path}] {name}");
            if ["chinese", "emoji", "emoji_zwj", "flags"].contains(&name) {
                assert!(held_back > 0, "[{path}] {name}: expected split characters");
            }
        }
    }
}

#[test]
fn skip_special_tokens_streams_only_text() {
    let (_, tokenizer) = smollm2_both().remove(0);
    let ids = tokenizer
        .encode("<|im_start|>assistant\nBonjour 🦀!<|im_end|>", false)
        .unwrap();
    let mut decoder = IncrementalDecoder::new(tokenizer.clone(), true);
    let mut streamed = String::new();
    for id in ids {
        streamed.push_str(&decoder.push(id).unwrap());
    }
    streamed.push_str(&decoder.finish().unwrap());
    assert_eq!(streamed, "assistant\nBonjour 🦀!");
}

#[test]
fn unfinished_character_is_flushed_at_the_end() {
    let (_, tokenizer) = smollm2_both().remove(0);
    // The first tokens of "🦀" only: the crab's four bytes are split across tokens.
    let ids = tokenizer.encode("🦀", false).unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    let mut decoder = IncrementalDecoder::new(tokenizer.clone(), false);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(decoder.push(id).unwrap(), "");
    }
    let tail = decoder.finish().unwrap();
    assert!(tail.contains('\u{FFFD}'), "{tail:?}");
    assert_eq!(decoder.finish().unwrap(), "");
}

#[test]
fn random_ids_stream_to_the_full_decode() {
    // Arbitrary ids (seeded LCG) produce invalid and split UTF-8 on purpose: whatever the
    // ids, the deltas plus the final flush are exactly the one-shot decode.
    let mut state: u64 = 0x5eed;
    let mut next = move |bound: u32| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % u64::from(bound)) as u32
    };
    for (path, tokenizer) in smollm2_both() {
        let vocab = tokenizer.vocab_size() as u32;
        for round in 0..100 {
            let len = 1 + next(40) as usize;
            // Half the rounds draw from the byte tokens (ids below 300 hold many
            // single-byte symbols) to get many split characters.
            let bound = if round % 2 == 0 { 300 } else { vocab };
            let ids: Vec<u32> = (0..len).map(|_| next(bound)).collect();
            let mut decoder = IncrementalDecoder::new(tokenizer.clone(), false);
            let mut streamed = String::new();
            for &id in &ids {
                streamed.push_str(&decoder.push(id).unwrap());
            }
            streamed.push_str(&decoder.finish().unwrap());
            assert_eq!(
                streamed,
                tokenizer.decode(&ids, false).unwrap(),
                "[{path}] {ids:?}"
            );
        }
    }
}
