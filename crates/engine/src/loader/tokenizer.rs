//! The tokenizer of a model: from the GGUF metadata, or the folder's `tokenizer.json`.

use std::path::Path;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tessera_tokenizer::{GgufVocab, MetaValue, Tokenizer};

use crate::error::{EngineError, Result};
use crate::loader::read_gguf_header;
use crate::spec::model::ModelConfig;

/// Loads the tokenizer (and chat template) that belongs to the model at `path`.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let tok_err = |e: tessera_tokenizer::TokenizerError| EngineError::BadFile {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    if !path.exists() {
        return Err(EngineError::MissingFile(path.to_path_buf()));
    }
    if path.is_dir() {
        return Tokenizer::from_hf_dir(path).map_err(tok_err);
    }
    let mut file = std::fs::File::open(path)?;
    let content = read_gguf_header(&mut file).map_err(|message| EngineError::BadFile {
        path: path.to_path_buf(),
        message: format!("not a valid GGUF file: {message}"),
    })?;
    tokenizer_from_metadata(&content.metadata).map_err(tok_err)
}

/// Refuses a tokenizer whose ids run past the model's token embedding: text would
/// tokenize into tokens the model has no row for (a `--tokenizer` of another model).
/// Fewer tokens than rows is fine (embeddings are often padded).
pub fn check_vocabulary(tokenizer: &Tokenizer, config: &ModelConfig) -> Result<()> {
    let tokens = tokenizer.vocab_size();
    if tokens > config.vocab_size {
        return Err(EngineError::Config(format!(
            "the tokenizer has a vocabulary of {tokens} tokens but the model's token \
             embedding has {} rows: ids from {} up have no embedding; use the tokenizer \
             that belongs to this model",
            config.vocab_size, config.vocab_size
        )));
    }
    Ok(())
}

/// The tokenizer (and chat template) described by a GGUF file's metadata.
pub fn tokenizer_from_metadata(
    metadata: &HashMap<String, Value>,
) -> tessera_tokenizer::Result<Tokenizer> {
    let vocab = GgufVocab::from_metadata(|key| metadata.get(key).map(to_meta))?;
    Tokenizer::from_gguf(&vocab)
}

fn to_meta(value: &Value) -> MetaValue {
    match value {
        Value::U8(v) => MetaValue::Int(i64::from(*v)),
        Value::I8(v) => MetaValue::Int(i64::from(*v)),
        Value::U16(v) => MetaValue::Int(i64::from(*v)),
        Value::I16(v) => MetaValue::Int(i64::from(*v)),
        Value::U32(v) => MetaValue::Int(i64::from(*v)),
        Value::I32(v) => MetaValue::Int(i64::from(*v)),
        Value::U64(v) => MetaValue::Int(i64::try_from(*v).unwrap_or(i64::MAX)),
        Value::I64(v) => MetaValue::Int(*v),
        Value::F32(v) => MetaValue::Float(f64::from(*v)),
        Value::F64(v) => MetaValue::Float(*v),
        Value::Bool(v) => MetaValue::Bool(*v),
        Value::String(v) => MetaValue::String(v.clone()),
        Value::Array(v) => MetaValue::Array(v.iter().map(to_meta).collect()),
    }
}
