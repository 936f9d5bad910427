//! GGUF files: tensors by canonical name, raw blocks kept; an expert's weight is read as
//! its slice of the 3-D expert tensor. The metadata is read by `crate::families::gguf`,
//! the names mapped by `gguf_names`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};

use crate::error::{EngineError, Result};
use crate::families::gguf::config_from_content;
use crate::loader::gguf_header::{mxfp4_bytes, read_gguf_parts, tensor_bytes, Mxfp4Tensor};
use crate::loader::gguf_names::{locate, GgufLocation};
use crate::loader::matrix::Matrix;
use crate::loader::mxfp4::{
    ggml_blocks_to_q5_0, GGML_MXFP4_BLOCK_BYTES, MXFP4_BLOCK, Q5_0_BLOCK_BYTES,
};
use crate::loader::source::{Embedding, StoredSize, TensorSource};
use crate::spec::model::ModelConfig;
use crate::spec::rope::RopeFactorTensors;

/// An open GGUF file. Tensor data is read on demand.
pub struct GgufSource {
    path: PathBuf,
    file: File,
    content: Content,
    /// MXFP4 tensors (gpt-oss's experts), read as Q5_0 blocks of the same values.
    mxfp4: HashMap<String, Mxfp4Tensor>,
    config: ModelConfig,
}

/// A GGUF header checked against the file: every tensor lies inside it, and the metadata
/// describes a model Tessera can run.
pub struct GgufHeader {
    pub content: Content,
    pub mxfp4: HashMap<String, Mxfp4Tensor>,
    pub config: ModelConfig,
}

impl GgufHeader {
    /// Reads and checks the header of the GGUF file in `reader`. The error is a message
    /// for the user; nothing the file claims is allocated before it is checked.
    pub fn read<R: Read + Seek>(reader: &mut R) -> std::result::Result<Self, String> {
        let parts = read_gguf_parts(reader).map_err(|e| format!("not a valid GGUF file: {e}"))?;
        let (content, mxfp4) = (parts.content, parts.mxfp4);
        let [freqs, long, short] =
            RopeFactorTensors::NAMES.map(|name| rope_factors(&content, reader, name));
        let factors = RopeFactorTensors {
            freqs: freqs?,
            long: long?,
            short: short?,
        };
        let mut config = config_from_content(&content, factors).map_err(|e| e.to_string())?;
        config.tie_word_embeddings = !content.tensor_infos.contains_key("output.weight");
        Ok(GgufHeader {
            content,
            mxfp4,
            config,
        })
    }
}

/// The per-frequency divisors of RoPE factor tensor `name` (llama.cpp's converter writes
/// Llama 3.1's scaling as `rope_freqs.weight`, LongRoPE's as `rope_factors_long.weight`
/// and `rope_factors_short.weight`), read as f32 once the tensor is known to be a short
/// vector.
fn rope_factors<R: Read + Seek>(
    content: &Content,
    reader: &mut R,
    name: &str,
) -> std::result::Result<Option<Vec<f32>>, String> {
    let Some(info) = content.tensor_infos.get(name) else {
        return Ok(None);
    };
    let dims = info.shape.dims();
    if info.ggml_dtype != GgmlDType::F32 || dims.len() != 1 || dims[0] > MAX_ROPE_FACTORS {
        return Err(format!(
            "{name}: expected an f32 vector of at most {MAX_ROPE_FACTORS} values, found {:?} \
             {dims:?}",
            info.ggml_dtype
        ));
    }
    let tensor = content
        .tensor(reader, name, &Device::Cpu)
        .and_then(|t| t.dequantize(&Device::Cpu))
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(Some(tensor))
}

/// More rotation pairs than any head dimension the engine accepts has.
const MAX_ROPE_FACTORS: usize = 512;

impl GgufSource {
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |message: String| EngineError::BadFile {
            path: path.to_path_buf(),
            message,
        };
        let mut file = File::open(path).map_err(|e| bad(e.to_string()))?;
        let GgufHeader {
            content,
            mxfp4,
            config,
        } = GgufHeader::read(&mut file).map_err(bad)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
            mxfp4,
            config,
        })
    }

    /// The file's metadata (tokenizer, chat template, ...).
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The location of `canonical` in this file. An expert's weight is its slice of the
    /// 3-D `ffn_*_exps` tensor, or, in files written before llama.cpp stacked experts
    /// (older Mixtral GGUFs), a 2-D tensor of its own, `blk.N.ffn_gate.E.weight`.
    fn locate(&self, canonical: &str) -> Result<GgufLocation> {
        let at = locate(&self.config.family.tensors, canonical)?;
        if let Some(expert) = at.expert {
            let stacked = self.content.tensor_infos.contains_key(&at.name)
                || self.mxfp4.contains_key(&at.name);
            if !stacked {
                let own = at
                    .name
                    .replace("_exps.weight", &format!(".{expert}.weight"));
                if self.content.tensor_infos.contains_key(&own) {
                    return Ok(GgufLocation {
                        name: own,
                        expert: None,
                    });
                }
            }
        }
        Ok(at)
    }

    /// The data of the tensor at `at`: its type, shape (outermost first) and bytes. An
    /// expert's location reads only that expert's `[rows, cols]` slice.
    fn raw(&self, at: &GgufLocation, canonical: &str) -> Result<(GgmlDType, Vec<usize>, Vec<u8>)> {
        if let Some(t) = self.mxfp4.get(&at.name) {
            return self.raw_mxfp4(at, t);
        }
        let info = self
            .content
            .tensor_infos
            .get(&at.name)
            .ok_or_else(|| EngineError::MissingTensor(format!("{} ({canonical})", at.name)))?;
        let dtype = info.ggml_dtype;
        check_supported(dtype, &at.name)?;
        // The header reader checked that every tensor's data lies inside the file.
        let mut len = tensor_bytes(info).unwrap_or(0) as usize;
        let mut dims = info.shape.dims().to_vec();
        let mut start = self.content.tensor_data_offset + info.offset;
        if let Some(expert) = at.expert {
            let (rows, cols) = self.expert_dims(at, &dims, dtype.block_size(), expert)?;
            // Experts are stored one after another, each `rows` rows of whole blocks.
            len /= dims[0];
            start += (expert * len) as u64;
            dims = vec![rows, cols];
        }
        let mut data = vec![0u8; len];
        self.file.read_exact_at(&mut data, start)?;
        Ok((dtype, dims, data))
    }

    /// An MXFP4 tensor (or an expert's slice of one) as Q5_0 blocks of the same values.
    fn raw_mxfp4(
        &self,
        at: &GgufLocation,
        t: &Mxfp4Tensor,
    ) -> Result<(GgmlDType, Vec<usize>, Vec<u8>)> {
        // The header reader checked the size and that the data lies inside the file.
        let mut len = mxfp4_bytes(&t.dims).unwrap_or(0) as usize;
        let mut start = self.content.tensor_data_offset + t.offset;
        let mut dims = t.dims.clone();
        if let Some(expert) = at.expert {
            let (rows, cols) = self.expert_dims(at, &dims, MXFP4_BLOCK, expert)?;
            len /= dims[0];
            start += (expert * len) as u64;
            dims = vec![rows, cols];
        }
        let mut blocks = vec![0u8; len];
        self.file.read_exact_at(&mut blocks, start)?;
        let mut data = Vec::with_capacity(len / GGML_MXFP4_BLOCK_BYTES * Q5_0_BLOCK_BYTES);
        ggml_blocks_to_q5_0(&blocks, &mut data);
        Ok((GgmlDType::Q5_0, dims, data))
    }

    /// `[rows, cols]` of expert `expert` of the 3-D tensor at `at` (`dims`: `[experts,
    /// rows, cols]`), checked: the expert exists and each row is whole quantization blocks
    /// of `block` columns. A 2-D tensor of biases (`[experts, len]`) gives `[1, len]`.
    fn expert_dims(
        &self,
        at: &GgufLocation,
        dims: &[usize],
        block: usize,
        expert: usize,
    ) -> Result<(usize, usize)> {
        let (experts, rows, cols) = match dims[..] {
            [experts, rows, cols] => (experts, rows, cols),
            // Biases: one row per expert.
            [experts, len] => (experts, 1, len),
            _ => {
                return Err(EngineError::ShapeMismatch {
                    name: at.name.clone(),
                    expected: vec![0, 0, 0],
                    found: dims.to_vec(),
                })
            }
        };
        if expert >= experts {
            return Err(EngineError::MissingTensor(format!(
                "{} (expert {expert}; the tensor holds {experts})",
                at.name
            )));
        }
        if !cols.is_multiple_of(block) {
            return Err(EngineError::BadFile {
                path: self.path.clone(),
                message: format!(
                    "tensor '{}': rows of {cols} columns are not whole blocks of {block}",
                    at.name
                ),
            });
        }
        Ok((rows, cols))
    }

    /// The name errors and shards carry for the tensor at `at`.
    fn display_name(at: &GgufLocation) -> String {
        match at.expert {
            Some(e) => format!("{} (expert {e})", at.name),
            None => at.name.clone(),
        }
    }
}

fn check_supported(dtype: GgmlDType, name: &str) -> Result<()> {
    match dtype {
        GgmlDType::F32
        | GgmlDType::F16
        | GgmlDType::BF16
        | GgmlDType::Q4_0
        | GgmlDType::Q4_1
        | GgmlDType::Q5_0
        | GgmlDType::Q5_1
        | GgmlDType::Q8_0
        | GgmlDType::Q2K
        | GgmlDType::Q3K
        | GgmlDType::Q4K
        | GgmlDType::Q5K
        | GgmlDType::Q6K => Ok(()),
        other => Err(EngineError::UnsupportedQuantization {
            name: name.to_string(),
            dtype: format!("{other:?}"),
        }),
    }
}

impl TensorSource for GgufSource {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn matrix(&self, name: &str) -> Result<Matrix> {
        let at = self.locate(name)?;
        let (dtype, dims, data) = self.raw(&at, name)?;
        let gname = Self::display_name(&at);
        let [rows, cols] = dims[..] else {
            return Err(EngineError::ShapeMismatch {
                name: gname,
                expected: vec![0, 0],
                found: dims,
            });
        };
        match dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => Ok(Matrix::Dense {
                name: gname,
                weight: dense_tensor(dtype, &data, &[rows, cols])?,
            }),
            _ => Ok(Matrix::Quantized {
                name: gname,
                dtype,
                rows,
                cols,
                data: Arc::new(data),
            }),
        }
    }

    fn vector(&self, name: &str) -> Result<Tensor> {
        let (dtype, dims, data) = self.raw(&self.locate(name)?, name)?;
        let q =
            candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, &data, dims, &Device::Cpu)?;
        Ok(q.dequantize(&Device::Cpu)?.flatten_all()?)
    }

    fn contains(&self, name: &str) -> bool {
        self.locate(name).is_ok_and(|at| {
            let dims = match (
                self.content.tensor_infos.get(&at.name),
                self.mxfp4.get(&at.name),
            ) {
                (Some(info), _) => info.shape.dims(),
                (None, Some(t)) => &t.dims[..],
                (None, None) => return false,
            };
            at.expert
                .is_none_or(|e| dims.first().is_some_and(|n| e < *n))
        })
    }

    fn block_cols(&self, name: &str) -> Result<usize> {
        let at = self.locate(name)?;
        if self.mxfp4.contains_key(&at.name) {
            return Ok(MXFP4_BLOCK);
        }
        let info = self
            .content
            .tensor_infos
            .get(&at.name)
            .ok_or_else(|| EngineError::MissingTensor(format!("{} ({name})", at.name)))?;
        Ok(match info.ggml_dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => 1,
            other => other.block_size(),
        })
    }

    fn embedding(&self) -> Result<Embedding> {
        let name = "model.embed_tokens.weight";
        let (dtype, dims, data) = self.raw(&self.locate(name)?, name)?;
        if let GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 = dtype {
            return Ok(Embedding::Dense(dense_tensor(dtype, &data, &dims)?));
        }
        let q =
            candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, &data, dims, &Device::Cpu)?;
        Ok(Embedding::Quantized(Arc::new(q)))
    }

    fn stored_size(&self, name: &str) -> Result<StoredSize> {
        let at = self.locate(name)?;
        let Some(info) = self.content.tensor_infos.get(&at.name) else {
            return Ok(StoredSize::of(&self.matrix(name)?));
        };
        let dims = info.shape.dims();
        // One expert of a stacked tensor is one `dims[0]`-th of it.
        let experts = match at.expert {
            Some(_) => dims.first().copied().unwrap_or(1).max(1),
            None => 1,
        };
        let elements = dims.iter().product::<usize>() / experts;
        Ok(match info.ggml_dtype {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => StoredSize::dense(elements),
            _ => StoredSize {
                elements,
                quantized_bytes: Some(tensor_bytes(info).unwrap_or(0) as usize / experts),
            },
        })
    }
}

/// A float tensor of the file in its own type (GGUF stores them little-endian, as the
/// hosts Tessera runs on).
fn dense_tensor(dtype: GgmlDType, data: &[u8], dims: &[usize]) -> Result<Tensor> {
    let dtype = match dtype {
        GgmlDType::F32 => DType::F32,
        GgmlDType::F16 => DType::F16,
        GgmlDType::BF16 => DType::BF16,
        other => {
            return Err(EngineError::Config(format!(
                "{other:?} is not a float type"
            )))
        }
    };
    Ok(Tensor::from_raw_buffer(data, dtype, dims, &Device::Cpu)?)
}

#[cfg(test)]
mod dtype_tests {
    use super::*;

    #[test]
    fn activation_only_types_are_refused_by_name() {
        let err = check_supported(GgmlDType::Q8_1, "blk.0.attn_q.weight")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("tensor 'blk.0.attn_q.weight' uses quantization Q8_1, which Tessera does not support")
        );
        assert!(check_supported(GgmlDType::Q4_1, "w").is_ok());
    }
}
