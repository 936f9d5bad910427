//! Hugging Face folders: `config.json` plus `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`. Matrices and the embedding table keep the file's float
//! type (f32, f16 or bf16) until a device takes its shard; vectors are read as f32.
//! gpt-oss's stacked experts are read per expert (`stacked_experts`), its MXFP4 ones as
//! Q5_0 matrices; FP8 weights are dequantized with their block scales (`fp8`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::{MmapedSafetensors, SliceSafetensors};
use candle_core::{DType, Device, Tensor};

use crate::error::{EngineError, Result};
use crate::families::hf;
use crate::families::hf_config::HfConfig;
use crate::loader::fp8::{scale_name, Fp8Blocks};
use crate::loader::matrix::Matrix;
use crate::loader::quantization;
use crate::loader::source::{Embedding, StoredSize, TensorSource};
use crate::spec::model::ModelConfig;

pub struct SafetensorsSource {
    files: MmapedSafetensors,
    config: ModelConfig,
    /// Block shape of an FP8 checkpoint's weight scales.
    fp8: Option<Fp8Blocks>,
}

impl SafetensorsSource {
    pub fn open(dir: &Path) -> Result<Self> {
        let bad = |message: String| EngineError::BadFile {
            path: dir.to_path_buf(),
            message,
        };
        let config_path = dir.join("config.json");
        if !config_path.exists() {
            return Err(EngineError::MissingFile(config_path));
        }
        let text = std::fs::read_to_string(&config_path)?;
        let hf: HfConfig = serde_json::from_str(&text).map_err(|e| EngineError::BadFile {
            path: config_path.clone(),
            message: e.to_string(),
        })?;
        let row = hf::family_row(&hf)?;
        let fp8 = quantization::gate(hf.quantization_config(), row.family)?;
        let config = hf::model_config(&hf, row)?;
        let files = weight_files(dir)?;
        if files.is_empty() {
            return Err(bad(
                "no weights: expected model.safetensors or model.safetensors.index.json".into(),
            ));
        }
        for f in &files {
            if !f.exists() {
                return Err(EngineError::MissingFile(f.clone()));
            }
        }
        // SAFETY: the files are mapped read-only; Tessera never writes them and expects
        // them not to change while the model is loaded (the usual contract of mmap loaders).
        let files = unsafe { MmapedSafetensors::multi(&files) }
            .map_err(|e| bad(format!("cannot read safetensors: {e}")))?;
        Ok(Self { files, config, fp8 })
    }

    /// The tensor in the file's float type (other types as f32).
    fn load(&self, name: &str) -> Result<Tensor> {
        if self.files.get(name).is_err() {
            return match super::stacked_experts::load(&self.files, name) {
                Some(t) => t,
                None => Err(EngineError::MissingTensor(name.to_string())),
            };
        }
        let t = self.files.load(name, &Device::Cpu)?;
        Ok(match t.dtype() {
            DType::F32 | DType::F16 | DType::BF16 => t,
            DType::F8E4M3 => self.dequantize_fp8(name, &t)?,
            _ => t.to_dtype(DType::F32)?,
        })
    }

    /// An FP8 weight times its block scales (`fp8`), as f32.
    fn dequantize_fp8(&self, name: &str, weight: &Tensor) -> Result<Tensor> {
        let blocks = self.fp8.ok_or_else(|| {
            EngineError::Config(format!(
                "{name} is FP8 but config.json has no quantization_config of method \"fp8\" \
             giving its weight_block_size"
            ))
        })?;
        let scale = scale_name(name);
        if self.files.get(&scale).is_err() {
            return Err(EngineError::MissingTensor(scale));
        }
        let scales = self.files.load(&scale, &Device::Cpu)?;
        blocks.dequantize(name, weight, &scales)
    }
}

/// Every tensor of a safetensors buffer as the loader reads it (f32 on the CPU). The
/// same header parsing and conversion as [`SafetensorsSource`], from bytes.
pub fn tensors_from_bytes(bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    let file = SliceSafetensors::new(bytes)?;
    let mut out = Vec::new();
    for (name, _) in file.tensors() {
        let tensor = file.load(&name, &Device::Cpu)?.to_dtype(DType::F32)?;
        out.push((name, tensor));
    }
    Ok(out)
}

fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&index)?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| EngineError::BadFile {
            path: index.clone(),
            message: e.to_string(),
        })?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| EngineError::BadFile {
            path: index.clone(),
            message: "no 'weight_map' object".into(),
        })?;
    let names: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

impl TensorSource for SafetensorsSource {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn matrix(&self, name: &str) -> Result<Matrix> {
        if let Some(m) = super::stacked_experts::mxfp4_matrix(&self.files, name) {
            return m;
        }
        let weight = self.load(name)?;
        if weight.rank() != 2 {
            return Err(EngineError::ShapeMismatch {
                name: name.to_string(),
                expected: vec![0, 0],
                found: weight.dims().to_vec(),
            });
        }
        Ok(Matrix::Dense {
            name: name.to_string(),
            weight,
        })
    }

    fn vector(&self, name: &str) -> Result<Tensor> {
        Ok(self.load(name)?.to_dtype(DType::F32)?.flatten_all()?)
    }

    fn contains(&self, name: &str) -> bool {
        self.files.get(name).is_ok() || super::stacked_experts::contains(&self.files, name)
    }

    fn block_cols(&self, name: &str) -> Result<usize> {
        if !self.contains(name) {
            return Err(EngineError::MissingTensor(name.to_string()));
        }
        Ok(match super::stacked_experts::is_mxfp4(&self.files, name) {
            true => super::mxfp4::MXFP4_BLOCK,
            false => 1,
        })
    }

    fn embedding(&self) -> Result<Embedding> {
        Ok(Embedding::Dense(self.load("model.embed_tokens.weight")?))
    }

    fn stored_size(&self, name: &str) -> Result<StoredSize> {
        match self.files.get(name) {
            Ok(view) => Ok(StoredSize::dense(view.shape().iter().product())),
            Err(_) => Ok(StoredSize::of(&self.matrix(name)?)),
        }
    }
}
