//! FP8 checkpoints (`quantization_config.quant_method` "fp8": Qwen3-FP8, MiniMax-M2,
//! GLM-4.5-FP8, DeepSeek-V3): weights in e4m3 with one f32 scale per block of
//! `weight_block_size` rows × columns, stored beside the weight as
//! `<name>_scale_inv` (the factor a block's values are multiplied by). They are
//! dequantized at load into f32, as the checkpoint's own dequantization computes them;
//! CPU ranks compute in f32 and CUDA ranks take the weight in their compute type, as any
//! float weight. Activations are not quantized: `activation_scheme` "dynamic" quantizes
//! them per step on FP8 hardware, and computing them in full precision instead is what
//! such a checkpoint's dequantized weights define.

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::error::{EngineError, Result};

/// A checkpoint's FP8 block shape: `weight_block_size` `[rows, cols]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fp8Blocks {
    pub rows: usize,
    pub cols: usize,
}

impl Fp8Blocks {
    /// The block shape of a `quantization_config` of method "fp8"; `None` for another
    /// method. What this loader cannot honour is refused by field: other formats than
    /// e4m3, static activation scales, per-tensor scales (no `weight_block_size`), and
    /// experts stored otherwise (`expert_dtype`). Power-of-two scales (`scale_fmt`
    /// "ue8m0") stored as f32 are ordinary scales.
    pub(crate) fn from_config(q: &Value) -> Result<Option<Self>> {
        if q.get("quant_method").and_then(Value::as_str) != Some("fp8") {
            return Ok(None);
        }
        let fail = |m: String| Err(EngineError::Config(format!("quantization_config: {m}")));
        match q.get("fmt").and_then(Value::as_str) {
            None | Some("e4m3" | "float8_e4m3fn") => {}
            Some(other) => return fail(format!("fmt '{other}' (only e4m3 is read)")),
        }
        match q.get("activation_scheme").and_then(Value::as_str) {
            None | Some("dynamic") => {}
            Some(other) => {
                return fail(format!(
                    "activation_scheme '{other}' (only \"dynamic\": no stored activation \
                     scales)"
                ))
            }
        }
        // DeepSeek's later checkpoints pack their experts in another format.
        match q.get("expert_dtype").and_then(Value::as_str) {
            None | Some("fp8") => {}
            Some(other) => {
                return fail(format!(
                    "expert_dtype '{other}' (only experts in the same e4m3 blocks are read)"
                ))
            }
        }
        let block = q
            .get("weight_block_size")
            .and_then(Value::as_array)
            .map(|b| b.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>());
        match block {
            Some(Some(b)) if b.len() == 2 && b.iter().all(|n| *n > 0) => Ok(Some(Fp8Blocks {
                rows: b[0] as usize,
                cols: b[1] as usize,
            })),
            _ => fail(
                "weight_block_size must be two positive integers (per-tensor FP8 scales are \
                 not read)"
                    .into(),
            ),
        }
    }

    /// `weight` (e4m3, `[rows, cols]`) times its block's scale from `scales`
    /// (`[⌈rows / block rows⌉, ⌈cols / block cols⌉]`), as f32.
    pub(crate) fn dequantize(
        &self,
        name: &str,
        weight: &Tensor,
        scales: &Tensor,
    ) -> Result<Tensor> {
        let (rows, cols) = weight.dims2()?;
        let want = (rows.div_ceil(self.rows), cols.div_ceil(self.cols));
        let scales = scales.to_dtype(DType::F32)?;
        if scales.dims() != [want.0, want.1] {
            return Err(EngineError::ShapeMismatch {
                name: scale_name(name),
                expected: vec![want.0, want.1],
                found: scales.dims().to_vec(),
            });
        }
        let scales = scales.to_vec2::<f32>()?;
        let mut values = weight
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        for (r, row) in values.chunks_exact_mut(cols.max(1)).enumerate() {
            let row_scales = &scales[r / self.rows];
            for (c, v) in row.iter_mut().enumerate() {
                *v *= row_scales[c / self.cols];
            }
        }
        Ok(Tensor::from_vec(values, (rows, cols), &Device::Cpu)?)
    }
}

/// The name of `weight`'s block scales.
pub(crate) fn scale_name(weight: &str) -> String {
    format!("{weight}_scale_inv")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e4m3(bytes: &[u8], shape: (usize, usize)) -> Result<Tensor> {
        Ok(Tensor::from_raw_buffer(
            bytes,
            DType::F8E4M3,
            &[shape.0, shape.1],
            &Device::Cpu,
        )?)
    }

    #[test]
    fn e4m3_bytes_decode_as_the_format_defines_them() -> Result<()> {
        // OCP FP8 e4m3fn: bias 7, three mantissa bits, no infinities, 448 the largest.
        let w = e4m3(&[0x38, 0xB8, 0x7E, 0x01, 0x00, 0x3C], (1, 6))?;
        let blocks = Fp8Blocks { rows: 1, cols: 6 };
        let s = Tensor::new(&[[1f32]], &Device::Cpu)?;
        let got = blocks.dequantize("w", &w, &s)?.to_vec2::<f32>()?;
        assert_eq!(got[0], vec![1.0, -1.0, 448.0, 2f32.powi(-9), 0.0, 1.5]);
        Ok(())
    }

    #[test]
    fn each_block_takes_its_own_scale_partial_blocks_included() -> Result<()> {
        // 3 × 5 in blocks of 2 × 2: scales [2, 3], the last row and column partial.
        let w = e4m3(&[0x38; 15], (3, 5))?;
        let s = Tensor::new(&[[1f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::Cpu)?;
        let blocks = Fp8Blocks { rows: 2, cols: 2 };
        let got = blocks.dequantize("w", &w, &s)?.to_vec2::<f32>()?;
        assert_eq!(got[0], vec![1.0, 1.0, 2.0, 2.0, 3.0]);
        assert_eq!(got[1], vec![1.0, 1.0, 2.0, 2.0, 3.0]);
        assert_eq!(got[2], vec![4.0, 4.0, 5.0, 5.0, 6.0]);
        let wrong = Tensor::new(&[[1f32, 2.0]], &Device::Cpu)?;
        assert!(matches!(
            blocks.dequantize("w", &w, &wrong),
            Err(EngineError::ShapeMismatch { .. })
        ));
        Ok(())
    }

    #[test]
    fn configs_are_read_or_refused_by_field() -> Result<()> {
        let read = |v: Value| Fp8Blocks::from_config(&v);
        assert_eq!(
            read(serde_json::json!({"quant_method": "fp8", "fmt": "e4m3",
                "activation_scheme": "dynamic", "weight_block_size": [128, 128]}))?,
            Some(Fp8Blocks {
                rows: 128,
                cols: 128
            })
        );
        assert_eq!(read(serde_json::json!({"quant_method": "mxfp4"}))?, None);
        for (bad, field) in [
            (
                serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128],
                    "activation_scheme": "static"}),
                "activation_scheme",
            ),
            (
                serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128],
                    "fmt": "e5m2"}),
                "fmt",
            ),
            (
                serde_json::json!({"quant_method": "fp8"}),
                "weight_block_size",
            ),
            (
                serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128],
                    "expert_dtype": "fp4"}),
                "expert_dtype",
            ),
            (
                serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 0]}),
                "weight_block_size",
            ),
        ] {
            match read(bad.clone()) {
                Err(EngineError::Config(m)) => assert!(m.contains(field), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        Ok(())
    }
}
