//! A whole `[out, in]` weight as read from a file, before it is cut into shards.
//!
//! Quantized weights stay quantized: selecting rows copies whole rows of blocks, selecting
//! columns copies whole blocks of each row (so column ranges must start on a block).

use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul};
use candle_core::{Device, Tensor};

use tessera_kernels::{QuantWeights, WeightFormat};

use crate::error::{EngineError, Result};
use crate::model::linear::LinearWeight;

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

    /// The matmul for this weight on `device`: Tessera's kernels where it has them (CPU;
    /// Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), candle's otherwise.
    pub fn into_linear_weight(self, device: &Device) -> Result<LinearWeight> {
        if let (
            Matrix::Quantized {
                dtype,
                rows,
                cols,
                data,
                name,
            },
            true,
        ) = (&self, device.is_cpu())
        {
            let format = kernel_format(*dtype);
            if let Some(format) = format {
                let w = QuantWeights::from_ggml_bytes(format, *rows, *cols, data).map_err(|m| {
                    EngineError::BadFile {
                        path: name.into(),
                        message: m,
                    }
                })?;
                return Ok(LinearWeight::Kernel(Arc::new(w)));
            }
        }
        Ok(LinearWeight::Candle(self.into_qmatmul(device)?))
    }

    /// As [`Matrix::into_linear_weight`], but a dense weight stays f32 on every device
    /// (a router, whose near-ties decide which experts run: CUDA ranks then score tokens
    /// as CPU ranks and llama.cpp do, not in bf16).
    pub fn into_f32_linear_weight(self, device: &Device) -> Result<LinearWeight> {
        match self {
            Matrix::Dense { weight, .. } => Ok(LinearWeight::Candle(QMatMul::Tensor(
                weight
                    .to_device(device)?
                    .to_dtype(candle_core::DType::F32)?,
            ))),
            quantized => quantized.into_linear_weight(device),
        }
    }

    /// candle's matmul for this weight on `device`.
    pub fn into_qmatmul(self, device: &Device) -> Result<QMatMul> {
        match self {
            Matrix::Quantized {
                dtype,
                rows,
                cols,
                data,
                ..
            } => {
                let q = qtensor_from_ggml(dtype, &data, vec![rows, cols], device)?;
                // candle dequantizes every weight to f32 when asked to
                // (`CANDLE_DEQUANTIZE_ALL`); such a weight takes the device's compute type,
                // as a dense one does (a GPU's bf16 activations cannot multiply f32).
                Ok(match QMatMul::from_qtensor(q)? {
                    QMatMul::Tensor(w) => {
                        QMatMul::Tensor(w.to_dtype(crate::model::compute_dtype(device))?)
                    }
                    other => other,
                })
            }
            Matrix::Dense { weight, .. } => Ok(QMatMul::Tensor(
                weight
                    .to_device(device)?
                    .to_dtype(crate::model::compute_dtype(device))?,
            )),
        }
    }
}

/// The format of Tessera's CPU kernels for a GGML type, where it has one.
pub fn kernel_format(dtype: GgmlDType) -> Option<WeightFormat> {
    match dtype {
        GgmlDType::Q4_1 => Some(WeightFormat::Q4_1),
        GgmlDType::Q5_0 => Some(WeightFormat::Q5_0),
        GgmlDType::Q8_0 => Some(WeightFormat::Q8_0),
        GgmlDType::Q4K => Some(WeightFormat::Q4K),
        GgmlDType::Q6K => Some(WeightFormat::Q6K),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::DType;

    fn quantized(rows: usize, cols: usize, dtype: GgmlDType) -> Result<(Tensor, Matrix)> {
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

    fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
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

    /// Our kernels read every format they take as candle (ggml's layout) does: the same
    /// blocks dequantize to the same floats, and the kernel matmul is close to a float
    /// matmul of candle's dequantized weights.
    #[test]
    fn kernel_formats_dequantize_as_candle_does() -> Result<()> {
        for dtype in [
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            let (rows, cols) = (9, 768);
            let (want, m) = quantized(rows, cols, dtype)?;
            let Some(format) = kernel_format(dtype) else {
                panic!("{dtype:?} has a kernel");
            };
            let Matrix::Quantized { data, .. } = &m else {
                panic!("quantized");
            };
            let w = QuantWeights::from_ggml_bytes(format, rows, cols, data)
                .map_err(EngineError::Config)?;
            let got = Tensor::from_vec(w.dequantize(), (rows, cols), &Device::Cpu)?;
            assert_eq!(max_diff(&got, &want)?, 0.0, "{dtype:?}");
            let x = Tensor::randn(0f32, 1.0, (3, cols), &Device::Cpu)?;
            let LinearWeight::Kernel(k) = m.into_linear_weight(&Device::Cpu)? else {
                panic!("{dtype:?} runs on the kernels");
            };
            let y = Tensor::from_vec(
                k.matmul(&x.flatten_all()?.to_vec1()?, 3),
                (3, rows),
                &Device::Cpu,
            )?;
            let exact = x.matmul(&want.t()?)?;
            let rel = ((&y - &exact)?.sqr()?.sum_all()?.to_scalar::<f32>()?
                / exact.sqr()?.sum_all()?.to_scalar::<f32>()?)
            .sqrt();
            assert!(rel < 0.02, "{dtype:?}: relative error {rel}");
        }
        Ok(())
    }

    fn dense(w: &Tensor) -> Matrix {
        Matrix::Dense {
            name: "w".into(),
            weight: w.clone(),
        }
    }

    /// A bf16 weight stays bf16 through sharding (half the bytes copied, and what a GPU
    /// takes as it is); only placing it on the CPU makes it f32, with the same values.
    #[test]
    fn dense_shards_keep_the_file_type_until_placed() -> Result<()> {
        let w = Tensor::randn(0f32, 1.0, (6, 8), &Device::Cpu)?.to_dtype(DType::BF16)?;
        let m = dense(&w).select_rows(&[1..3, 4..6])?.select_cols(2..8)?;
        let Matrix::Dense { weight, .. } = &m else {
            panic!("dense");
        };
        assert_eq!(weight.dtype(), DType::BF16);
        assert_eq!(m.size_bytes(), 4 * 6 * 2);
        let QMatMul::Tensor(placed) = m.into_qmatmul(&Device::Cpu)? else {
            panic!("a dense weight stays a tensor");
        };
        assert_eq!(placed.dtype(), DType::F32);
        let want = Tensor::cat(&[w.narrow(0, 1, 2)?, w.narrow(0, 4, 2)?], 0)?
            .narrow(1, 2, 6)?
            .to_dtype(DType::F32)?;
        assert_eq!(max_diff(&placed, &want)?, 0.0);
        Ok(())
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
