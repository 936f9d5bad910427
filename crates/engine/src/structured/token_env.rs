//! The token trie llguidance walks to compute masks, built from our tokenizer's vocabulary.
//!
//! Each id maps to the bytes it stands for: byte-level BPE names (`Ġthe`) are mapped back
//! through GPT-2's byte table, byte-fallback names (`<0x0A>`) become their byte, and
//! special tokens get llguidance's marker byte so no grammar can produce them as text.
//! Ids the model's output layer has beyond the tokenizer's (padding rows) become
//! placeholder specials: they are never allowed under a constraint.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tessera_tokenizer::Tokenizer;

use crate::error::{EngineError, Result};

/// llguidance's view of the vocabulary: the trie, and our tokenizer for the few strings
/// the grammar compiler tokenizes itself.
struct VocabEnv {
    trie: TokTrie,
    backend: tokenizers::Tokenizer,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.backend
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// Builds the token environment for a model whose output layer has `model_vocab` rows.
pub fn token_env(tokenizer: &Tokenizer, model_vocab: usize) -> Result<TokEnv> {
    let mut token_bytes = token_bytes(tokenizer)?;
    if model_vocab < token_bytes.len() {
        return Err(EngineError::TokenTrie(format!(
            "the tokenizer has {} tokens but the model only {model_vocab} logits",
            token_bytes.len()
        )));
    }
    while token_bytes.len() < model_vocab {
        let mut name = format!(".<[{}]>", token_bytes.len()).into_bytes();
        name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        token_bytes.push(name);
    }
    let eos = tokenizer.eos_token_ids();
    let first_eos = *eos.first().ok_or_else(|| {
        EngineError::TokenTrie("the tokenizer declares no end-of-sequence token".into())
    })?;
    let vocab_size = u32::try_from(model_vocab)
        .map_err(|_| EngineError::TokenTrie(format!("vocabulary of {model_vocab} tokens")))?;
    let mut info = TokRxInfo::new(vocab_size, first_eos);
    info.tok_bos = tokenizer.bos_token_id();
    let mut trie = TokTrie::from(&info, &token_bytes);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(eos);
    }
    Ok(Arc::new(VocabEnv {
        trie,
        backend: tokenizer.backend().clone(),
    }))
}

/// The bytes of every id of the tokenizer (added tokens included).
fn token_bytes(tokenizer: &Tokenizer) -> Result<Vec<Vec<u8>>> {
    let json = serde_json::to_value(tokenizer.backend())
        .map_err(|e| EngineError::TokenTrie(format!("serializing the tokenizer: {e}")))?;
    // llguidance reads the vocabulary the way the decoder does (byte-level or byte
    // fallback); it panics on malformed byte-fallback names, so guard the call.
    let result = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
        .map_err(|_| EngineError::TokenTrie("malformed vocabulary".into()))?;
    let mut bytes = result.map_err(|e| EngineError::TokenTrie(e.to_string()))?;
    bytes.resize(bytes.len().max(tokenizer.vocab_size()), Vec::new());
    // Our tokenizer's notion of special (GGUF control tokens included) wins: such ids
    // must never be produced as text.
    for (id, b) in bytes.iter_mut().enumerate() {
        let special = u32::try_from(id).is_ok_and(|id| tokenizer.is_special(id));
        if special && b.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
            b.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
    }
    Ok(bytes)
}
