//! The real SmolLM2 tokenizer on arbitrary input: text round-trips, any ids decode (or
//! are refused), and the incremental decoder agrees with a whole decode.

use tessera_tokenizer::{IncrementalDecoder, TokenizerError};

use crate::model::tokenizer as model_tokenizer;

/// Input: a mode byte, then text (mode even) or little-endian u16 token ids (mode odd;
/// u16 so that most ids land inside the 49k vocabulary).
pub fn tokenizer(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        text(rest, mode & 2 != 0);
    } else {
        let ids: Vec<u32> = rest
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        ids_in(&ids, mode & 2 != 0);
    }
}

fn text(bytes: &[u8], add_special: bool) {
    let tok = model_tokenizer();
    let text = String::from_utf8_lossy(bytes);
    let ids = match tok.encode(&text, add_special) {
        Ok(ids) => ids,
        // A byte the vocabulary has no token for is refused, never dropped; the refusal
        // must name a byte that really is in the text.
        Err(TokenizerError::Unrepresentable { byte }) => {
            assert!(
                text.as_bytes().contains(&byte),
                "refused byte 0x{byte:02X} not in the text"
            );
            return;
        }
        Err(e) => panic!("encoding text failed: {e}"),
    };
    let vocab = tok.vocab_size();
    assert!(
        ids.iter().all(|&id| (id as usize) < vocab),
        "an id out of the vocabulary"
    );
    if !add_special {
        // Byte-level BPE: whatever text goes in comes back out, special tokens included.
        match tok.decode(&ids, false) {
            Ok(back) => assert_eq!(back, text, "text does not round-trip through {ids:?}"),
            Err(e) => panic!("decoding encoded text failed: {e}"),
        }
    }
}

fn ids_in(ids: &[u32], skip_special: bool) {
    let tok = model_tokenizer();
    let whole = tok.decode(ids, skip_special);
    let mut decoder = IncrementalDecoder::new(tok.clone(), skip_special);
    let mut streamed = String::new();
    for &id in ids {
        match decoder.push(id) {
            Ok(delta) => streamed.push_str(&delta),
            Err(_) => return,
        }
    }
    match decoder.finish() {
        Ok(tail) => streamed.push_str(&tail),
        Err(_) => return,
    }
    if let Ok(whole) = whole {
        assert_eq!(
            streamed, whole,
            "streamed text differs from a whole decode of {ids:?}"
        );
    }
}
