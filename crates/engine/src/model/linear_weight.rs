//! The matmul behind a linear layer, and how a weight read from a file becomes one on a
//! device: Tessera's CPU kernels for the quantized formats they take, candle's matmul for
//! the rest; a dense weight in the device's compute type.

use std::sync::Arc;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul};
use candle_core::Device;
use tessera_kernels::{QuantWeights, WeightFormat};

use crate::device::dtype::compute_dtype;
use crate::error::{EngineError, Result};
use crate::loader::matrix::Matrix;

/// The matmul behind a linear layer.
#[derive(Debug, Clone)]
pub enum LinearWeight {
    /// candle's matmul (dense weights, and quantized formats without a kernel of ours).
    Candle(QMatMul),
    /// Tessera's CPU kernels (Q4_1, Q8_0), with ggml's activation quantization.
    Kernel(Arc<QuantWeights>),
}

impl LinearWeight {
    /// The matmul for `matrix` on `device`: Tessera's kernels where it has them (CPU;
    /// Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), candle's otherwise.
    pub fn place(matrix: Matrix, device: &Device) -> Result<Self> {
        if let (
            Matrix::Quantized {
                dtype,
                rows,
                cols,
                data,
                name,
            },
            true,
        ) = (&matrix, device.is_cpu())
        {
            if let Some(format) = kernel_format(*dtype) {
                let w = QuantWeights::from_ggml_bytes(format, *rows, *cols, data).map_err(|m| {
                    EngineError::BadFile {
                        path: name.into(),
                        message: m,
                    }
                })?;
                return Ok(LinearWeight::Kernel(Arc::new(w)));
            }
        }
        Ok(LinearWeight::Candle(candle_matmul(matrix, device)?))
    }

    /// As [`LinearWeight::place`], but a dense weight stays f32 on every device (a
    /// router, whose near-ties decide which experts run: CUDA ranks then score tokens as
    /// CPU ranks and llama.cpp do, not in bf16).
    pub fn place_f32(matrix: Matrix, device: &Device) -> Result<Self> {
        match matrix {
            Matrix::Dense { weight, .. } => Ok(LinearWeight::Candle(QMatMul::Tensor(
                weight
                    .to_device(device)?
                    .to_dtype(candle_core::DType::F32)?,
            ))),
            quantized => Self::place(quantized, device),
        }
    }
}

/// candle's matmul for `matrix` on `device`.
pub fn candle_matmul(matrix: Matrix, device: &Device) -> Result<QMatMul> {
    match matrix {
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
                QMatMul::Tensor(w) => QMatMul::Tensor(w.to_dtype(compute_dtype(device))?),
                other => other,
            })
        }
        Matrix::Dense { weight, .. } => Ok(QMatMul::Tensor(
            weight.to_device(device)?.to_dtype(compute_dtype(device))?,
        )),
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
    use candle_core::{DType, Tensor};

    use super::*;
    use crate::loader::matrix::tests::{dense, max_diff, quantized};

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
            let LinearWeight::Kernel(k) = LinearWeight::place(m, &Device::Cpu)? else {
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
        let QMatMul::Tensor(placed) = candle_matmul(m, &Device::Cpu)? else {
            panic!("a dense weight stays a tensor");
        };
        assert_eq!(placed.dtype(), DType::F32);
        let want = Tensor::cat(&[w.narrow(0, 1, 2)?, w.narrow(0, 4, 2)?], 0)?
            .narrow(1, 2, 6)?
            .to_dtype(DType::F32)?;
        assert_eq!(max_diff(&placed, &want)?, 0.0);
        Ok(())
    }
}
