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
//! Only the asked expert's slab is read from the mapped file. MXFP4 values (a 4-bit
//! e2m1 code times a power of two per 32 values) are exact in bf16, so they are expanded
//! to bf16 without loss.

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use safetensors::Dtype;

use crate::error::{EngineError, Result};

/// The e2m1 values of the 16 MXFP4 codes (the high bit is the sign).
const FP4_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];
/// Values per MXFP4 block (one shared scale), and the bytes holding them.
const MXFP4_BLOCK: usize = 32;
const MXFP4_BLOCK_BYTES: usize = MXFP4_BLOCK / 2;

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

/// The expert tensor `name` from the stacked tensors, `None` when the file does not stack
/// it: a matrix `[out, in]` (bf16 from MXFP4, else the file's type) or a bias vector.
pub(super) fn load(files: &MmapedSafetensors, name: &str) -> Option<Result<Tensor>> {
    if !contains(files, name) {
        return None;
    }
    let part = parse(name)?;
    Some(load_part(files, &part, name))
}

fn load_part(files: &MmapedSafetensors, part: &ExpertPart, name: &str) -> Result<Tensor> {
    if part.bias {
        let bias = slab(files, &part.stacked("_bias"), part.expert)?;
        return Ok(match part.interleaved_row() {
            Some(i) => every_other(&bias, 0, i)?,
            None => bias,
        });
    }
    // Output-major `[out, in]`.
    let weight = if files.get(&part.stacked("")).is_ok() {
        slab(files, &part.stacked(""), part.expert)?.t()?
    } else {
        mxfp4_slab(files, part, name)?
    };
    Ok(match part.interleaved_row() {
        Some(i) => every_other(&weight, 0, i)?,
        None => weight.contiguous()?,
    })
}

/// Rows (`dim` 0) or elements `i, i + 2, ...` of `t`.
fn every_other(t: &Tensor, dim: usize, i: usize) -> Result<Tensor> {
    let dims = t.dims();
    let (n, rest) = (dims[dim], &dims[dim + 1..]);
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

/// Expert `e`'s MXFP4 weight, `[out, in]` in bf16.
fn mxfp4_slab(files: &MmapedSafetensors, part: &ExpertPart, name: &str) -> Result<Tensor> {
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
    let [rows, groups, bytes] = code_shape[..] else {
        return Err(shape_error(&blocks_name, &code_shape));
    };
    if bytes != MXFP4_BLOCK_BYTES || exp_shape != [rows, groups] {
        return Err(EngineError::ShapeMismatch {
            name: format!("{name} ({scales_name})"),
            expected: vec![rows, groups],
            found: exp_shape,
        });
    }
    let values = dequantize_mxfp4(codes, exps);
    Ok(Tensor::from_vec(
        values,
        (rows, groups * MXFP4_BLOCK),
        &Device::Cpu,
    )?)
}

fn shape_error(name: &str, found: &[usize]) -> EngineError {
    EngineError::ShapeMismatch {
        name: name.to_string(),
        expected: vec![0, 0, MXFP4_BLOCK_BYTES],
        found: found.to_vec(),
    }
}

/// MXFP4 blocks as values: block `b` of 16 bytes holds 32 codes, value `2j` in the low
/// nibble of byte `j` and `2j + 1` in its high nibble, each times `2^(scales[b] − 127)`.
pub(crate) fn dequantize_mxfp4(codes: &[u8], scales: &[u8]) -> Vec<half::bf16> {
    let mut out = Vec::with_capacity(scales.len() * MXFP4_BLOCK);
    for (block, &scale) in codes.chunks_exact(MXFP4_BLOCK_BYTES).zip(scales) {
        let factor = 2f32.powi(i32::from(scale) - 127);
        for &byte in block {
            for code in [byte & 0x0f, byte >> 4] {
                out.push(half::bf16::from_f32(FP4_VALUES[usize::from(code)] * factor));
            }
        }
    }
    out
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

    #[test]
    fn mxfp4_codes_take_their_nibbles_and_scales() {
        // Byte 0x71: code 1 (0.5) low, code 7 (6.0) high; 0xf8: -0.0 low, -6.0 high.
        let mut codes = vec![0u8; 32];
        codes[0] = 0x71;
        codes[1] = 0xf8;
        codes[16] = 0x2a; // second block: -1.0, then 1.0
        let values = dequantize_mxfp4(&codes, &[127 + 2, 127 - 3]);
        let v: Vec<f32> = values.iter().map(|x| x.to_f32()).collect();
        assert_eq!(&v[..4], &[0.5 * 4.0, 6.0 * 4.0, 0.0, -6.0 * 4.0]);
        assert!(v[4..32].iter().all(|x| *x == 0.0));
        assert_eq!(&v[32..34], &[-1.0 / 8.0, 1.0 / 8.0]);
        assert_eq!(v.len(), 64);
    }
}
