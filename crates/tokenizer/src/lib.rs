//! Text <-> tokens for Tessera.
//!
//! * [`Tokenizer`]: encode/decode, special ids and the chat template of one model, built
//!   from a Hugging Face `tokenizer.json` ([`Tokenizer::from_hf_dir`]) or from GGUF
//!   metadata ([`GgufVocab`] + [`Tokenizer::from_gguf`]).
//! * [`ChatTemplate`]: the model's Jinja chat template, rendered as transformers renders it,
//!   with bounded execution.
//! * [`IncrementalDecoder`]: token ids in, text deltas out, never half a character.
//! * [`StopMatcher`]: stop strings across delta boundaries.
//! * [`FimTokens`]: a code model's fill-in-the-middle sentinels ([`Tokenizer::encode_infill`]).
//!
//! Errors are one enum, [`TokenizerError`].

// Unit tests state their expectations by unwrapping; library code never does.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod bounded;
mod chat_message;
mod chat_template;
mod error;
mod fim;
mod gguf_backend;
mod gguf_spm;
mod gguf_vocab;
mod hf_config;
mod incremental_decoder;
mod py_json;
pub mod sandbox;
mod stop_matcher;
mod strftime;
mod template_settings;
mod tokenizer;

pub use chat_message::{ChatMessage, ContentFormat, MessageContent};
pub use chat_template::{ChatRenderRequest, ChatTemplate, ChatTemplateConfig, SpecialTokenStrings};
pub use error::{Result, TokenizerError};
pub use fim::{FimOrder, FimTokens, INFILL_END_MARKERS};
pub use gguf_vocab::{GgufVocab, MetaValue, TokenType};
pub use hf_config::HfTokenizerConfig;
pub use incremental_decoder::IncrementalDecoder;
pub use stop_matcher::{StopMatcher, StopOutcome};
pub use tokenizer::{HfTokenizerFiles, Tokenizer, END_OF_TURN_MARKERS};
