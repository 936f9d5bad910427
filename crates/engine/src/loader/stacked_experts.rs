//! gpt-oss's experts as the model asks for them: one matrix per expert and projection
//! (`model.layers.L.mlp.experts.E.gate_proj.weight`, `up_proj`, `down_proj`, and their
//! `.bias`), read from the tensors a checkpoint stacks per layer:
//!
//! - `mlp.experts.gate_up_proj` `[experts, hidden, 2·inter]` (input-major, as
//!   transformers multiplies it), the gate in even columns and up in odd ones, and
//!   `mlp.experts.down_proj` `[experts, inter, hidden]`; or, as OpenAI's checkpoints ship
//!   them, MXFP4 blocks in output-major order: `gate_up_proj_blocks`
//!   `[experts, 2·inter, hidden/32, 16]` with `gate_up_proj_scales`
//!   `[experts, 2·inter, hidden/32]` (gate in even rows), and `down_proj_blocks` /
//!   `down_proj_scales` `[experts, hidden, inter/32, ..]`;
//! - `mlp.experts.gate_up_proj_bias` `[experts, 2·inter]` (interleaved alike) and
//!   `mlp.experts.down_proj_bias` `[experts, hidden]`.
//!
//! Only the asked expert's slab is read from the mapped file. MXFP4 experts become Q5_0
//! blocks of the same values (`mxfp4.rs`).

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use safetensors::Dtype;

use crate::error::{EngineError, Result};
use crate::loader::Matrix;

use super::mxfp4::{hf_blocks_to_q5_0, MXFP4_BLOCK, MXFP4_CODE_BYTES, Q5_0_BLOCK_BYTES};

/// One expert tensor of a canonical name.
#[derive(Debug, Clone, PartialEq)]
struct ExpertPart {
    /// `model.layers.L.mlp.experts`
    stack: String,
    expert: usize,
    proj: Proj,
    bias: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Proj {
    Gate,
    Up,
    Down,
}

fn parse(name: &str) -> Option<ExpertPart> {
    let (stack, rest) = name.split_once(".mlp.experts.")?;
    let mut parts = rest.split('.');
    let expert = parts.next()?.parse().ok()?;
    let proj = match parts.next()? {
        "gate_proj" => Proj::Gate,
        "up_proj" => Proj::Up,
        "down_proj" => Proj::Down,
        _ => return None,
    };
    let bias = match parts.next()? {
        "weight" => false,
        "bias" => true,
        _ => return None,
    };
    parts.next().is_none().then(|| ExpertPart {
        stack: format!("{stack}.mlp.experts"),
        expert,
        proj,
        bias,
    })
}

impl ExpertPart {
    fn stacked(&self, suffix: &str) -> String {
        let proj = match self.proj {
            Proj::Gate | Proj::Up => "gate_up_proj",
            Proj::Down => "down_proj",
        };
        format!("{}.{proj}{suffix}", self.stack)
    }

    /// Which of the interleaved rows (gate even, up odd) this part keeps.
    fn interleaved_row(&self) -> Option<usize> {
        match self.proj {
            Proj::Gate => Some(0),
            Proj::Up => Some(1),
            Proj::Down => None,
        }
    }
}

/// Whether `name` is an expert tensor the file stacks.
pub(super) fn contains(files: &MmapedSafetensors, name: &str) -> bool {
    let Some(part) = parse(name) else {
        return false;
    };
    let has = |suffix: &str| files.get(&part.stacked(suffix)).is_ok();
    match part.bias {
        true => has("_bias"),
        false => has("") || (has("_blocks") && has("_scales")),
    }
}

/// Whether `name` is an expert matrix the file holds in MXFP4.
pub(super) fn is_mxfp4(files: &MmapedSafetensors, name: &str) -> bool {
    let Some(part) = parse(name) else {
        return false;
    };
    let has = |suffix: &str| files.get(&part.stacked(suffix)).is_ok();
    !part.bias && !has("") && has("_blocks") && has("_scales")
}

/// The expert tensor `name` from the stacked float tensors, `None` when the file does not
/// stack it so: a matrix `[out, in]` in the file's type, or a bias vector.
pub(super) fn load(files: &MmapedSafetensors, name: &str) -> Option<Result<Tensor>> {
    let part = parse(name)?;
    let stacked = part.stacked(if part.bias { "_bias" } else { "" });
    files.get(&stacked).ok()?;
    Some(load_part(files, &part, &stacked))
}

/// The expert matrix `name` from MXFP4 blocks, as Q5_0; `None` when it is not so stored.
pub(super) fn mxfp4_matrix(files: &MmapedSafetensors, name: &str) -> Option<Result<Matrix>> {
    if !is_mxfp4(files, name) {
        return None;
    }
    let part = parse(name)?;
    Some(mxfp4_slab(files, &part, name))
}

fn load_part(files: &MmapedSafetensors, part: &ExpertPart, stacked: &str) -> Result<Tensor> {
    let t = slab(files, stacked, part.expert)?;
    // Weights become output-major `[out, in]`.
    let t = if part.bias { t } else { t.t()? };
    Ok(match part.interleaved_row() {
        Some(i) => every_other(&t, i)?,
        None => t.contiguous()?,
    })
}

/// Rows (or elements) `i, i + 2, ...` of `t`.
fn every_other(t: &Tensor, i: usize) -> Result<Tensor> {
    let dims = t.dims();
    let (n, rest) = (dims[0], &dims[1..]);
    if !n.is_multiple_of(2) {
        return Err(EngineError::Config(format!(
            "interleaved gate/up of odd length {n}"
        )));
    }
    let mut shape = vec![n / 2, 2];
    shape.extend_from_slice(rest);
    let mut out: Vec<usize> = vec![n / 2];
    out.extend_from_slice(rest);
    Ok(t.reshape(shape)?
        .narrow(1, i, 1)?
        .reshape(out)?
        .contiguous()?)
}

/// Expert `e`'s slab of a stacked float tensor `[experts, ...]`, in the file's type.
fn slab(files: &MmapedSafetensors, name: &str, e: usize) -> Result<Tensor> {
    let view = files.get(name)?;
    let dtype = match view.dtype() {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        other => {
            return Err(EngineError::Config(format!(
                "{name}: stacked experts of type {other:?}"
            )))
        }
    };
    let (data, shape) = expert_bytes(name, view.data(), view.shape(), e, dtype.size_in_bytes())?;
    Ok(Tensor::from_raw_buffer(data, dtype, &shape, &Device::Cpu)?)
}

/// Expert `e`'s bytes of a stacked tensor and the shape of one expert.
fn expert_bytes<'a>(
    name: &str,
    data: &'a [u8],
    shape: &[usize],
    e: usize,
    elem_bytes: usize,
) -> Result<(&'a [u8], Vec<usize>)> {
    let Some((&experts, inner)) = shape.split_first() else {
        return Err(EngineError::Config(format!("{name}: a scalar")));
    };
    if e >= experts {
        return Err(EngineError::MissingTensor(format!(
            "{name}: expert {e} of {experts}"
        )));
    }
    let len = inner.iter().product::<usize>() * elem_bytes;
    let bytes = data
        .get(e * len..(e + 1) * len)
        .ok_or_else(|| EngineError::Config(format!("{name}: shorter than its shape")))?;
    Ok((bytes, inner.to_vec()))
}

/// Expert `e`'s MXFP4 weight as Q5_0 `[out, in]` (the gate's or up's rows of an
/// interleaved gate/up).
fn mxfp4_slab(files: &MmapedSafetensors, part: &ExpertPart, name: &str) -> Result<Matrix> {
    let (blocks_name, scales_name) = (part.stacked("_blocks"), part.stacked("_scales"));
    let (blocks, scales) = (files.get(&blocks_name)?, files.get(&scales_name)?);
    for (n, v) in [(&blocks_name, &blocks), (&scales_name, &scales)] {
        if v.dtype() != Dtype::U8 {
            return Err(EngineError::Config(format!(
                "{n}: MXFP4 {:?}, expected U8",
                v.dtype()
            )));
        }
    }
    let (codes, code_shape) =
        expert_bytes(&blocks_name, blocks.data(), blocks.shape(), part.expert, 1)?;
    let (exps, exp_shape) =
        expert_bytes(&scales_name, scales.data(), scales.shape(), part.expert, 1)?;
    let [rows, groups, MXFP4_CODE_BYTES] = code_shape[..] else {
        return Err(EngineError::ShapeMismatch {
            name: blocks_name,
            expected: vec![0, 0, MXFP4_CODE_BYTES],
            found: code_shape,
        });
    };
    if exp_shape != [rows, groups] {
        return Err(EngineError::ShapeMismatch {
            name: format!("{name} ({scales_name})"),
            expected: vec![rows, groups],
            found: exp_shape,
        });
    }
    let kept: Vec<usize> = match part.interleaved_row() {
        Some(i) if rows.is_multiple_of(2) => (i..rows).step_by(2).collect(),
        Some(_) => {
            return Err(EngineError::Config(format!(
                "{blocks_name}: interleaved gate/up of odd length {rows}"
            )))
        }
        None => (0..rows).collect(),
    };
    let mut data = Vec::with_capacity(kept.len() * groups * Q5_0_BLOCK_BYTES);
    let row_bytes = groups * MXFP4_CODE_BYTES;
    for r in &kept {
        hf_blocks_to_q5_0(
            &codes[r * row_bytes..(r + 1) * row_bytes],
            &exps[r * groups..(r + 1) * groups],
            &mut data,
        );
    }
    Ok(Matrix::Quantized {
        name: name.to_string(),
        dtype: GgmlDType::Q5_0,
        rows: kept.len(),
        cols: groups * MXFP4_BLOCK,
        data: Arc::new(data),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names_are_parsed_and_others_left_alone() {
        let p = parse("model.layers.3.mlp.experts.17.up_proj.bias").expect("parsed");
        assert_eq!(
            (p.stack.as_str(), p.expert, p.proj, p.bias),
            ("model.layers.3.mlp.experts", 17, Proj::Up, true)
        );
        assert_eq!(
            p.stacked("_bias"),
            "model.layers.3.mlp.experts.gate_up_proj_bias"
        );
        for other in [
            "model.layers.3.mlp.experts.gate_up_proj",
            "model.layers.3.mlp.router.weight",
            "model.layers.3.mlp.experts.1.w1.weight",
            "model.layers.3.mlp.experts.1.gate_proj.weight.extra",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }
}
