//! SmolLM2's tokenizer, from the GGUF and from tokenizer.json, against transformers'
//! ids and decoded text (tests/fixtures/tokenizer/smollm2_tokenize.json).

#![allow(clippy::unwrap_used)] // tests state their expectations by unwrapping

mod common;

use std::sync::Arc;

use common::{cases, ids_of, load_fixture, smollm2_both, smollm2_gguf, smollm2_hf, smollm2_vocab};
use tessera_tokenizer::Tokenizer;

/// The reference of each path: the GGUF path follows llama.cpp (`ids_llamacpp`), the
/// tokenizer.json path follows transformers (`ids`), whose tokenizer.json it loads.
/// The two references differ where transformers' GGUF loader drops SmolLM2's digit
/// pre-split (see `references_differ_only_on_whitespace_before_digits`).
fn reference_ids(path: &str, case: &serde_json::Value) -> Vec<u32> {
    match path {
        "gguf" => ids_of(&case["ids_llamacpp"]),
        _ => ids_of(&case["ids"]),
    }
}

#[test]
fn ids_equal_the_reference_for_every_case_on_both_paths() {
    let fixture = load_fixture("smollm2_tokenize.json");
    let mut failures = Vec::new();
    for (path, tokenizer) in smollm2_both() {
        for case in cases(&fixture) {
            let name = case["name"].as_str().unwrap();
            let text = case["text"].as_str().unwrap();
            let expected = reference_ids(path, case);
            let got = tokenizer.encode(text, false).unwrap();
            if got != expected {
                failures.push(format!(
                    "[{path}] {name}: expected {expected:?}, got {got:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn references_differ_only_on_whitespace_before_digits() {
    // llama.cpp splits `\p{N}` first (tokenizer.ggml.pre = smollm, as the model's original
    // tokenizer.json does with its Digits pre-tokenizer), so "\n    1" is ["\n    ", "1"];
    // transformers' GGUF loader applies GPT-2's regex alone, giving ["\n   ", " 1"].
    let fixture = load_fixture("smollm2_tokenize.json");
    let mut differing = Vec::new();
    for case in cases(&fixture) {
        let text = case["text"].as_str().unwrap();
        let chars: Vec<char> = text.chars().collect();
        let whitespace_run_before_digit = chars
            .windows(3)
            .any(|w| w[0].is_whitespace() && w[1].is_whitespace() && w[2].is_numeric());
        let differs = case["ids"] != case["ids_llamacpp"];
        assert_eq!(differs, whitespace_run_before_digit, "{}", case["name"]);
        if differs {
            differing.push(case["name"].as_str().unwrap());
        }
    }
    assert_eq!(differing, ["digits_after_whitespace", "indented_config"]);
}

#[test]
fn decode_equals_transformers_and_round_trips() {
    let fixture = load_fixture("smollm2_tokenize.json");
    for (path, tokenizer) in smollm2_both() {
        for case in cases(&fixture) {
            let name = case["name"].as_str().unwrap();
            // Both references' ids decode to the text, whichever path decodes them.
            let llamacpp = tokenizer
                .decode(&ids_of(&case["ids_llamacpp"]), false)
                .unwrap();
            assert_eq!(
                llamacpp,
                case["text"].as_str().unwrap(),
                "[{path}] {name} llama.cpp ids"
            );
            let ids = ids_of(&case["ids"]);
            let decoded = tokenizer.decode(&ids, false).unwrap();
            assert_eq!(
                decoded,
                case["decoded"].as_str().unwrap(),
                "[{path}] {name}"
            );
            assert_eq!(
                decoded,
                case["text"].as_str().unwrap(),
                "[{path}] {name} round trip"
            );
            let skipped = tokenizer.decode(&ids, true).unwrap();
            assert_eq!(
                skipped,
                case["decoded_skip_special"].as_str().unwrap(),
                "[{path}] {name} skip_special_tokens"
            );
        }
    }
}

#[test]
fn special_tokens_in_text_map_to_their_ids() {
    for (path, tokenizer) in smollm2_both() {
        let ids = tokenizer
            .encode("<|im_start|>user\nHi<|im_end|>", false)
            .unwrap();
        assert_eq!(ids.first(), Some(&1), "[{path}]");
        assert_eq!(ids.last(), Some(&2), "[{path}]");
        assert_eq!(tokenizer.token_to_id("<|im_start|>"), Some(1), "[{path}]");
        assert_eq!(
            tokenizer.id_to_token(2).as_deref(),
            Some("<|im_end|>"),
            "[{path}]"
        );
        assert!(
            tokenizer.is_special(0) && tokenizer.is_special(2),
            "[{path}]"
        );
        assert!(!tokenizer.is_special(504), "[{path}]");
    }
}

#[test]
fn special_ids_and_sizes_agree_between_paths() {
    let fixture = load_fixture("smollm2_tokenize.json");
    let vocab_size = fixture["vocab_size"].as_u64().unwrap() as usize;
    for (path, tokenizer) in smollm2_both() {
        assert_eq!(tokenizer.vocab_size(), vocab_size, "[{path}]");
        assert_eq!(
            tokenizer.bos_token_id(),
            fixture["bos_token_id"].as_u64().map(|v| v as u32),
            "[{path}]"
        );
        // eos (<|im_end|> = 2, declared) and <|endoftext|> (0, an end-of-turn marker).
        assert_eq!(tokenizer.eos_token_ids(), &[0, 2], "[{path}]");
        let debug = format!("{tokenizer:?}");
        assert!(
            debug.len() < 300 && debug.contains("vocab_size: 49152"),
            "{debug}"
        );
        let specials = tokenizer.special_token_strings();
        assert_eq!(
            specials.bos_token.as_deref(),
            Some("<|im_start|>"),
            "[{path}]"
        );
        assert_eq!(
            specials.eos_token.as_deref(),
            Some("<|im_end|>"),
            "[{path}]"
        );
    }
}

#[test]
fn gguf_metadata_is_read() {
    let vocab = smollm2_vocab();
    assert_eq!(vocab.model, "gpt2");
    assert_eq!(vocab.pre.as_deref(), Some("smollm"));
    assert_eq!(vocab.tokens.len(), 49152);
    assert_eq!(vocab.tokens.len(), vocab.token_types.len());
    assert!(!vocab.merges.is_empty());
    assert_eq!(vocab.eos_token_id, Some(2));
    assert!(vocab
        .chat_template
        .as_deref()
        .unwrap_or_default()
        .contains("<|im_start|>"));
}

#[test]
fn add_special_tokens_follows_the_model() {
    // SmolLM2 adds no BOS (tokenizer.ggml.add_bos_token is false; the tokenizer.json
    // post-processor adds nothing): both paths give the same ids either way.
    for (path, tokenizer) in smollm2_both() {
        assert_eq!(
            tokenizer.encode("Hello", true).unwrap(),
            tokenizer.encode("Hello", false).unwrap(),
            "[{path}]"
        );
    }
}

#[test]
fn encoding_is_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();

    let fixture = load_fixture("smollm2_tokenize.json");
    let tokenizer: Arc<Tokenizer> = smollm2_gguf();
    let hf = smollm2_hf();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (tokenizer, hf, fixture) = (&tokenizer, &hf, &fixture);
            scope.spawn(move || {
                for _ in 0..5 {
                    for case in cases(fixture).iter().skip(thread) {
                        let text = case["text"].as_str().unwrap();
                        let (gguf_ids, hf_ids) = (&case["ids_llamacpp"], &case["ids"]);
                        assert_eq!(tokenizer.encode(text, false).unwrap(), ids_of(gguf_ids));
                        assert_eq!(hf.encode(text, false).unwrap(), ids_of(hf_ids));
                    }
                }
            });
        }
    });
}

#[test]
fn gguf_and_tokenizer_json_agree_on_larger_texts() {
    // This crate's sources and the fixture script: code, comments, Unicode, long lines.
    // Digits become `#`: the two paths differ by design on whitespace before digits.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // The sources of `src/` and of its folders.
    let mut files = Vec::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.push(common::fixture_dir().join("make_token_fixtures.py"));
    files.sort();
    let (gguf, hf) = (smollm2_gguf(), smollm2_hf());
    for file in files {
        let text: String = std::fs::read_to_string(&file)
            .unwrap()
            .chars()
            .map(|c| if c.is_numeric() { '#' } else { c })
            .collect();
        let ids = gguf.encode(&text, false).unwrap();
        let hf_ids = hf.encode(&text, false).unwrap();
        if let Some(at) = (0..ids.len().max(hf_ids.len())).find(|&i| ids.get(i) != hf_ids.get(i)) {
            let window = |v: &[u32]| -> Vec<String> {
                v[at.saturating_sub(3)..(at + 4).min(v.len())]
                    .iter()
                    .map(|&id| gguf.id_to_token(id).unwrap())
                    .collect()
            };
            panic!(
                "{}: first difference at token {at}: gguf {:?} vs tokenizer.json {:?}",
                file.display(),
                window(&ids),
                window(&hf_ids)
            );
        }
        assert_eq!(
            gguf.decode(&ids, false).unwrap(),
            text,
            "{}",
            file.display()
        );
    }
}
