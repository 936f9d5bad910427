//! Opening a model file: a GGUF file or a Hugging Face folder, with fused projections
//! read as their parts and the context limited where the server says.

use std::path::Path;

use crate::error::{EngineError, Result};
use crate::loader::context_limit::ContextLimit;
use crate::loader::fused::FusedProjections;
use crate::loader::gguf::GgufSource;
use crate::loader::safetensors::SafetensorsSource;
use crate::loader::source::TensorSource;

/// Opens a model: a `.gguf` file, or a folder with `config.json` and safetensors.
pub fn open(path: &Path) -> Result<Box<dyn TensorSource>> {
    if !path.exists() {
        return Err(EngineError::MissingFile(path.to_path_buf()));
    }
    let source: Box<dyn TensorSource> = if path.is_dir() {
        Box::new(SafetensorsSource::open(path)?)
    } else {
        Box::new(GgufSource::open(path)?)
    };
    Ok(Box::new(FusedProjections::new(source)))
}

/// Opens a model as [`open`] does, to be served with at most `max_model_len` positions
/// where that is given.
pub fn open_served(path: &Path, max_model_len: Option<usize>) -> Result<Box<dyn TensorSource>> {
    let source = open(path)?;
    match max_model_len {
        Some(n) => Ok(Box::new(ContextLimit::new(source, n)?)),
        None => Ok(source),
    }
}
