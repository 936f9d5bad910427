//! A GGUF file's metadata and tensor table as the families read them ([`Gguf`]): keys of
//! the file's architecture (`<arch>.embedding_length`) by their suffix, typed, each
//! refusal naming the whole key.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};

use crate::error::{EngineError, Result};

/// The metadata and tensor names of one GGUF file of architecture [`Gguf::arch`].
pub(crate) struct Gguf<'a> {
    content: &'a Content,
    arch: String,
}

impl<'a> Gguf<'a> {
    /// The file's header, with the architecture its `general.architecture` names.
    pub(crate) fn new(content: &'a Content) -> Result<Self> {
        let arch = value(&content.metadata, "general.architecture")?
            .to_string()
            .map_err(|e| EngineError::Config(e.to_string()))?
            .clone();
        Ok(Self { content, arch })
    }

    /// `general.architecture`: the prefix of the file's model keys.
    pub(crate) fn arch(&self) -> &str {
        &self.arch
    }

    /// The whole key of `<arch>.<suffix>`.
    pub(crate) fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    pub(crate) fn metadata(&self) -> &'a HashMap<String, Value> {
        &self.content.metadata
    }

    /// Whether the file holds tensor `name` (its GGUF name).
    pub(crate) fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// `<arch>.<suffix>`, where the file has it.
    pub(crate) fn get(&self, suffix: &str) -> Option<&'a Value> {
        self.content.metadata.get(&self.key(suffix))
    }

    /// `<arch>.<suffix>` as a count; missing or of another type is an error.
    pub(crate) fn usize(&self, suffix: &str) -> Result<usize> {
        count(self.metadata(), &self.key(suffix))
    }

    /// `<arch>.<suffix>` where the file has it; a value of the wrong type is an error,
    /// not a default.
    pub(crate) fn usize_opt(&self, suffix: &str) -> Result<Option<usize>> {
        let key = self.key(suffix);
        self.metadata()
            .contains_key(&key)
            .then(|| count(self.metadata(), &key))
            .transpose()
    }

    /// `<arch>.<suffix>` as a float; missing or of another type is an error.
    pub(crate) fn f32(&self, suffix: &str) -> Result<f32> {
        let key = self.key(suffix);
        value(self.metadata(), &key)?
            .to_f32()
            .map_err(|e| EngineError::Config(format!("metadata '{key}': {e}")))
    }

    /// `<arch>.<suffix>` where the file has it, as [`Gguf::f32`] reads it.
    pub(crate) fn f32_opt(&self, suffix: &str) -> Result<Option<f32>> {
        self.get(suffix).map(|_| self.f32(suffix)).transpose()
    }

    /// `<arch>.<suffix>` where the file has it, as a flag.
    pub(crate) fn bool_opt(&self, suffix: &str) -> Result<Option<bool>> {
        self.get(suffix)
            .map(|v| {
                v.to_bool().map_err(|e| {
                    EngineError::Config(format!("metadata '{}': {e}", self.key(suffix)))
                })
            })
            .transpose()
    }
}

fn value<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a Value> {
    md.get(key)
        .ok_or_else(|| EngineError::Config(format!("missing metadata key '{key}'")))
}

fn count(md: &HashMap<String, Value>, key: &str) -> Result<usize> {
    let v = value(md, key)?;
    let n = v
        .to_u64()
        .or_else(|_| v.to_u32().map(u64::from))
        .or_else(|_| v.to_i32().map(|x| x.max(0) as u64))
        .map_err(|e| EngineError::Config(format!("metadata '{key}': {e}")))?;
    Ok(n as usize)
}
