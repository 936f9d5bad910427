//! A whole `[out, in]` weight as read from a file, before it is cut into shards.
//!
//! Quantized weights stay quantized: selecting rows copies whole rows of blocks, selecting
//! columns copies whole blocks of each row (so column ranges must start on a block).

use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use candle_core::Tensor;

use crate::error::{EngineError, Result};

/// A 2-D weight with `rows` output features and `cols` input features.
#[derive(Debug, Clone)]
pub enum Matrix {
    /// GGML blocks, row-major; each row holds `cols / block_size` blocks.
    Quantized {
        name: String,
        dtype: GgmlDType,
        rows: usize,
        cols: usize,
        data: Arc<Vec<u8>>,
    },
    /// Float weights in the file's type (f32, f16 or bf16), on the host. A shard takes
    /// its device's type when placed ([`Matrix::into_qmatmul`]), so a bf16 file reaches a
    /// GPU as it is, without a pass through f32.
    Dense { name: String, weight: Tensor },
}

impl Matrix {
    pub fn name(&self) -> &str {
        match self {
            Matrix::Quantized { name, .. } | Matrix::Dense { name, .. } => name,
        }
    }

    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Matrix::Quantized { rows, cols, .. } => Ok((*rows, *cols)),
            Matrix::Dense { weight, .. } => Ok(weight.dims2()?),
        }
    }

    /// Bytes of weight data read from the file for this matrix.
    pub fn size_bytes(&self) -> usize {
        match self {
            Matrix::Quantized { data, .. } => data.len(),
            Matrix::Dense { weight, .. } => weight.elem_count() * weight.dtype().size_in_bytes(),
        }
    }

    /// Quantization block in columns (1 for dense weights).
    pub fn block_cols(&self) -> usize {
        match self {
            Matrix::Quantized { dtype, .. } => dtype.block_size(),
            Matrix::Dense { .. } => 1,
        }
    }

    pub fn check_dims(&self, expected: (usize, usize)) -> Result<()> {
        let found = self.dims()?;
        if found != expected {
            return Err(EngineError::ShapeMismatch {
                name: self.name().to_string(),
                expected: vec![expected.0, expected.1],
                found: vec![found.0, found.1],
            });
        }
        Ok(())
    }

    /// The rows in `ranges`, concatenated in order.
    pub fn select_rows(&self, ranges: &[Range<usize>]) -> Result<Matrix> {
        let (rows, cols) = self.dims()?;
        for r in ranges {
            if r.end > rows || r.start > r.end {
                return Err(EngineError::Parallel(format!(
                    "row range {r:?} outside '{}' with {rows} rows",
                    self.name()
                )));
            }
        }
        match self {
            Matrix::Quantized {
                name, dtype, data, ..
            } => {
                let row_bytes = cols / dtype.block_size() * dtype.type_size();
                let mut out =
                    Vec::with_capacity(ranges.iter().map(|r| r.len()).sum::<usize>() * row_bytes);
                for r in ranges {
                    out.extend_from_slice(&data[r.start * row_bytes..r.end * row_bytes]);
                }
                let rows = ranges.iter().map(|r| r.len()).sum();
                Ok(Matrix::Quantized {
                    name: name.clone(),
                    dtype: *dtype,
                    rows,
                    cols,
                    data: Arc::new(out),
                })
            }
            Matrix::Dense { name, weight } => {
                let parts = ranges
                    .iter()
                    .map(|r| weight.narrow(0, r.start, r.len()))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Ok(Matrix::Dense {
                    name: name.clone(),
                    weight: Tensor::cat(&parts, 0)?.contiguous()?,
                })
            }
        }
    }

    /// The columns in `range`, which must start on a quantization block and end on one
    /// (or at the last column).
    pub fn select_cols(&self, range: Range<usize>) -> Result<Matrix> {
        let (rows, cols) = self.dims()?;
        let block = self.block_cols();
        if range.end > cols || range.start >= range.end {
            return Err(EngineError::Parallel(format!(
                "column range {range:?} outside '{}' with {cols} columns",
                self.name()
            )));
        }
        if !range.start.is_multiple_of(block)
            || (!range.end.is_multiple_of(block) && range.end != cols)
        {
            return Err(EngineError::Parallel(format!(
                "column range {range:?} of '{}' does not fall on its {block}-column quantization blocks",
                self.name()
            )));
        }
        match self {
            Matrix::Quantized {
                name, dtype, data, ..
            } => {
                let ts = dtype.type_size();
                let row_bytes = cols / block * ts;
                let (b0, b1) = (range.start / block * ts, range.end.div_ceil(block) * ts);
                let mut out = Vec::with_capacity(rows * (b1 - b0));
                for row in 0..rows {
                    out.extend_from_slice(&data[row * row_bytes + b0..row * row_bytes + b1]);
                }
                Ok(Matrix::Quantized {
                    name: name.clone(),
                    dtype: *dtype,
                    rows,
                    cols: range.len(),
                    data: Arc::new(out),
                })
            }
            Matrix::Dense { name, weight } => Ok(Matrix::Dense {
                name: name.clone(),
                weight: weight.narrow(1, range.start, range.len())?.contiguous()?,
            }),
        }
    }

    /// Row concatenation of matrices with the same column count and representation;
    /// `None` when they cannot be fused (different quantization or float types).
    pub fn concat_rows(parts: &[Matrix], name: &str) -> Result<Option<Matrix>> {
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        match first {
            Matrix::Quantized { dtype, cols, .. } => {
                let mut data = Vec::new();
                let mut rows = 0;
                for p in parts {
                    match p {
                        Matrix::Quantized {
                            dtype: d,
                            cols: c,
                            rows: r,
                            data: bytes,
                            ..
                        } if d == dtype && c == cols => {
                            data.extend_from_slice(bytes);
                            rows += r;
                        }
                        _ => return Ok(None),
                    }
                }
                Ok(Some(Matrix::Quantized {
                    name: name.to_string(),
                    dtype: *dtype,
                    rows,
                    cols: *cols,
                    data: Arc::new(data),
                }))
            }
            Matrix::Dense { weight: w0, .. } => {
                let mut ws = Vec::with_capacity(parts.len());
                for p in parts {
                    match p {
                        Matrix::Dense { weight, .. } if weight.dtype() == w0.dtype() => {
                            ws.push(weight.clone())
                        }
                        _ => return Ok(None),
                    }
                }
                Ok(Some(Matrix::Dense {
                    name: name.to_string(),
                    weight: Tensor::cat(&ws, 0)?,
                }))
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::quantized::ggml_file::qtensor_from_ggml;
    use candle_core::quantized::QTensor;
    use candle_core::{DType, Device};

    pub(crate) fn quantized(
        rows: usize,
        cols: usize,
        dtype: GgmlDType,
    ) -> Result<(Tensor, Matrix)> {
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu)?;
        let q = QTensor::quantize(&w, dtype)?;
        let deq = q.dequantize(&Device::Cpu)?;
        let data = q.data()?.to_vec();
        Ok((
            deq,
            Matrix::Quantized {
                name: "w".into(),
                dtype,
                rows,
                cols,
                data: Arc::new(data),
            },
        ))
    }

    fn deq(m: Matrix) -> Result<Tensor> {
        match m {
            Matrix::Quantized {
                dtype,
                rows,
                cols,
                data,
                ..
            } => Ok(
                qtensor_from_ggml(dtype, &data, vec![rows, cols], &Device::Cpu)?
                    .dequantize(&Device::Cpu)?,
            ),
            Matrix::Dense { weight, .. } => Ok(weight),
        }
    }

    pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
    }

    #[test]
    fn quantized_row_and_column_slices_match_dense_slices() -> Result<()> {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K] {
            let cols = 512;
            let (full, m) = quantized(6, cols, dtype)?;
            let rows = deq(m.select_rows(&[1..3, 4..6])?)?;
            let want = Tensor::cat(&[full.narrow(0, 1, 2)?, full.narrow(0, 4, 2)?], 0)?;
            assert_eq!(max_diff(&rows, &want)?, 0.0);
            let b = dtype.block_size();
            let cols_sel = deq(m.select_cols(b..cols)?)?;
            assert_eq!(max_diff(&cols_sel, &full.narrow(1, b, cols - b)?)?, 0.0);
            assert!(m.select_cols(1..cols).is_err());
        }
        Ok(())
    }

    pub(crate) fn dense(w: &Tensor) -> Matrix {
        Matrix::Dense {
            name: "w".into(),
            weight: w.clone(),
        }
    }

    #[test]
    fn fusing_dense_rows_needs_one_float_type() -> Result<()> {
        let w = Tensor::randn(0f32, 1.0, (2, 8), &Device::Cpu)?;
        let b = w.to_dtype(DType::BF16)?;
        assert!(Matrix::concat_rows(&[dense(&b), dense(&w)], "bw")?.is_none());
        let Some(Matrix::Dense { weight, .. }) =
            Matrix::concat_rows(&[dense(&b), dense(&b)], "bb")?
        else {
            panic!("two bf16 matrices fuse");
        };
        assert_eq!((weight.dtype(), weight.dims2()?), (DType::BF16, (4, 8)));
        Ok(())
    }

    #[test]
    fn fusing_rows_needs_one_quantization_type() -> Result<()> {
        let (_, a) = quantized(2, 64, GgmlDType::Q4_1)?;
        let (_, b) = quantized(2, 64, GgmlDType::Q8_0)?;
        assert!(Matrix::concat_rows(&[a.clone(), b], "ab")?.is_none());
        let fused = Matrix::concat_rows(&[a.clone(), a], "aa")?;
        assert_eq!(fused.map(|m| m.dims().ok()), Some(Some((4, 64))));
        Ok(())
    }
}
