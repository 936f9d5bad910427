//! `GgufVocab`: the tokenizer described by a GGUF file's `tokenizer.*` metadata, as plain data.
//!
//! The crate does not depend on candle: the engine hands over each metadata value converted
//! into the small [`MetaValue`] enum, through a lookup closure. Keys follow the GGUF spec
//! (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`, ...). Token types follow llama.cpp's
//! numbering (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).

use crate::error::{Result, TokenizerError};
use crate::fim::{FimOrder, FimTokens};

/// One GGUF metadata value, in a form that does not tie this crate to a GGUF reader.
///
/// All integer widths map to `Int`, both float widths to `Float`.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    String(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Array(Vec<MetaValue>),
}

/// What a vocabulary entry is, from `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// An ordinary BPE token (type 1), also used when the file has no type array.
    Normal,
    /// The unknown token (type 2).
    Unknown,
    /// A special token such as `<|im_start|>` (type 3): matched in text, skipped on decode
    /// with `skip_special_tokens`.
    Control,
    /// A token added by the model author (type 4): matched in text, decoded like text.
    UserDefined,
    /// A reserved, never-produced slot (type 5).
    Unused,
    /// A raw byte token such as `<0x0A>` (type 6, SentencePiece vocabularies).
    Byte,
    /// Any other number.
    Undefined(i64),
}

impl TokenType {
    /// Maps llama.cpp's numbering to the enum.
    pub fn from_code(code: i64) -> Self {
        match code {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            other => TokenType::Undefined(other),
        }
    }
}

/// Everything a GGUF file says about its tokenizer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece), ...
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name (`smollm`, `llama-bpe`, `qwen2`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token text of every id, in id order.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: one per token, or empty when the file has none.
    pub token_types: Vec<TokenType>,
    /// `tokenizer.ggml.merges`: BPE merges as `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores`: one per token, or empty (SentencePiece uses them).
    pub scores: Vec<f32>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: end of turn, when the converter recorded one.
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`: end of message (Llama 3.1 tool calls).
    pub eom_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`, when present.
    pub add_bos_token: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`, when present.
    pub add_eos_token: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece): a `▁` before the text, when
    /// present.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`, when present.
    pub chat_template: Option<String>,
    /// Fill-in-the-middle sentinels the file names (`tokenizer.ggml.fim_pre_token_id`,
    /// `fim_suf_token_id` and `fim_mid_token_id`, or the older `prefix_token_id`,
    /// `suffix_token_id` and `middle_token_id`), when it names all three.
    pub fim: Option<FimTokens>,
}

impl GgufVocab {
    /// Reads the tokenizer keys through `lookup`, which returns the value of a metadata key
    /// or `None` when the file lacks it.
    ///
    /// Required: `tokenizer.ggml.model` and `tokenizer.ggml.tokens`. Array lengths of token
    /// types and scores must equal the token count, and special ids must be in range.
    pub fn from_metadata<F>(lookup: F) -> Result<Self>
    where
        F: Fn(&str) -> Option<MetaValue>,
    {
        let get = |key: &str| lookup(key);
        let model = match get("tokenizer.ggml.model") {
            Some(v) => as_string("tokenizer.ggml.model", v)?,
            None => return Err(missing("tokenizer.ggml.model")),
        };
        let pre = get("tokenizer.ggml.pre")
            .map(|v| as_string("tokenizer.ggml.pre", v))
            .transpose()?;
        let tokens = match get("tokenizer.ggml.tokens") {
            Some(v) => as_array("tokenizer.ggml.tokens", v)?
                .into_iter()
                .map(|t| as_string("tokenizer.ggml.tokens", t))
                .collect::<Result<Vec<_>>>()?,
            None => return Err(missing("tokenizer.ggml.tokens")),
        };
        let token_types = match get("tokenizer.ggml.token_type") {
            Some(v) => as_array("tokenizer.ggml.token_type", v)?
                .into_iter()
                .map(|t| as_int("tokenizer.ggml.token_type", t).map(TokenType::from_code))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let merges = match get("tokenizer.ggml.merges") {
            Some(v) => as_array("tokenizer.ggml.merges", v)?
                .into_iter()
                .map(|t| as_string("tokenizer.ggml.merges", t))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let scores = match get("tokenizer.ggml.scores") {
            Some(v) => as_array("tokenizer.ggml.scores", v)?
                .into_iter()
                .map(|t| as_float("tokenizer.ggml.scores", t).map(|f| f as f32))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let id = |key: &str| -> Result<Option<u32>> {
            match get(key) {
                None => Ok(None),
                Some(v) => {
                    let raw = as_int(key, v)?;
                    let id = u32::try_from(raw).map_err(|_| invalid(key, "negative id"))?;
                    if id as usize >= tokens.len() {
                        return Err(invalid(
                            key,
                            &format!("id {id} is outside the vocabulary of {}", tokens.len()),
                        ));
                    }
                    Ok(Some(id))
                }
            }
        };
        let declared = |new: &str, old: &str| -> Result<Option<u32>> {
            Ok(id(&format!("tokenizer.ggml.{new}_token_id"))?
                .or(id(&format!("tokenizer.ggml.{old}_token_id"))?))
        };
        let fim = match (
            declared("fim_pre", "prefix")?,
            declared("fim_suf", "suffix")?,
            declared("fim_mid", "middle")?,
        ) {
            (Some(prefix), Some(suffix), Some(middle)) => Some(FimTokens {
                prefix,
                suffix,
                middle: Some(middle),
                order: FimOrder::PrefixFirst,
            }),
            _ => None,
        };
        let flag =
            |key: &str| -> Result<Option<bool>> { get(key).map(|v| as_bool(key, v)).transpose() };
        let vocab = GgufVocab {
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            eos_token_id: id("tokenizer.ggml.eos_token_id")?,
            eot_token_id: id("tokenizer.ggml.eot_token_id")?,
            eom_token_id: id("tokenizer.ggml.eom_token_id")?,
            unknown_token_id: id("tokenizer.ggml.unknown_token_id")?,
            padding_token_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos_token: flag("tokenizer.ggml.add_bos_token")?,
            add_eos_token: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            chat_template: get("tokenizer.chat_template")
                .map(|v| as_string("tokenizer.chat_template", v))
                .transpose()?,
            fim,
            model,
            pre,
            tokens,
            token_types,
            merges,
            scores,
        };
        vocab.check_lengths()?;
        Ok(vocab)
    }

    /// The type of token `id`; `Normal` when the file has no type array.
    pub fn token_type(&self, id: usize) -> TokenType {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(TokenType::Normal)
    }

    fn check_lengths(&self) -> Result<()> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(invalid("tokenizer.ggml.tokens", "empty vocabulary"));
        }
        if !self.token_types.is_empty() && self.token_types.len() != n {
            return Err(invalid(
                "tokenizer.ggml.token_type",
                &format!("{} entries for {n} tokens", self.token_types.len()),
            ));
        }
        if !self.scores.is_empty() && self.scores.len() != n {
            return Err(invalid(
                "tokenizer.ggml.scores",
                &format!("{} entries for {n} tokens", self.scores.len()),
            ));
        }
        Ok(())
    }
}

fn missing(key: &str) -> TokenizerError {
    TokenizerError::MissingMetadata {
        key: key.to_string(),
    }
}

fn invalid(key: &str, reason: &str) -> TokenizerError {
    TokenizerError::InvalidMetadata {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

fn kind(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::String(_) => "a string",
        MetaValue::Int(_) => "an integer",
        MetaValue::Float(_) => "a float",
        MetaValue::Bool(_) => "a bool",
        MetaValue::Array(_) => "an array",
    }
}

fn as_string(key: &str, v: MetaValue) -> Result<String> {
    match v {
        MetaValue::String(s) => Ok(s),
        other => Err(invalid(
            key,
            &format!("expected a string, got {}", kind(&other)),
        )),
    }
}

fn as_int(key: &str, v: MetaValue) -> Result<i64> {
    match v {
        MetaValue::Int(i) => Ok(i),
        other => Err(invalid(
            key,
            &format!("expected an integer, got {}", kind(&other)),
        )),
    }
}

fn as_float(key: &str, v: MetaValue) -> Result<f64> {
    match v {
        MetaValue::Float(f) => Ok(f),
        MetaValue::Int(i) => Ok(i as f64),
        other => Err(invalid(
            key,
            &format!("expected a float, got {}", kind(&other)),
        )),
    }
}

fn as_bool(key: &str, v: MetaValue) -> Result<bool> {
    match v {
        MetaValue::Bool(b) => Ok(b),
        MetaValue::Int(i) => Ok(i != 0),
        other => Err(invalid(
            key,
            &format!("expected a bool, got {}", kind(&other)),
        )),
    }
}

fn as_array(key: &str, v: MetaValue) -> Result<Vec<MetaValue>> {
    match v {
        MetaValue::Array(a) => Ok(a),
        other => Err(invalid(
            key,
            &format!("expected an array, got {}", kind(&other)),
        )),
    }
}
