//! Linear layers of a shard: column-parallel (output features split, possibly several
//! fused segments) and row-parallel (input features split, output is a partial sum).

use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};

use crate::error::Result;
use crate::loader::matrix::Matrix;
use crate::model::cpu_ops;
use crate::model::linear_weight::LinearWeight;
use crate::spec::model::Activation;
use crate::tp::SplitState;

/// `y = x Wᵀ (+ b)` over one shard of `W`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: LinearWeight, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// The layer with `bias` (f32 on the host), placed on `device` in its compute type;
    /// `None` leaves it without one.
    pub fn with_bias(mut self, bias: Option<&Tensor>, device: &Device) -> Result<Self> {
        self.bias = match bias {
            Some(b) => Some(
                b.to_device(device)?
                    .to_dtype(crate::device::dtype::compute_dtype(device))?,
            ),
            None => None,
        };
        Ok(self)
    }

    /// The dense weight candle multiplies by (`[out, in]`), where the layer has one and
    /// no bias.
    pub(crate) fn dense_weight(&self) -> Option<&Tensor> {
        match (&self.weight, &self.bias) {
            (LinearWeight::Candle(QMatMul::Tensor(w)), None) => Some(w),
            _ => None,
        }
    }

    /// `x · Wᵀ` in f32 (`[tokens, out]`), whatever the weights: on CUDA a bf16 product
    /// accumulates and returns f32 (cuBLAS GemmEx) and quantized weights read f32
    /// activations; on CPU this is [`Linear::forward`].
    pub fn forward_f32(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(y) = self.quantized_decode(x)? {
            return self.add_bias(y);
        }
        #[cfg(feature = "cuda")]
        if let (LinearWeight::Candle(QMatMul::Tensor(w)), candle_core::Device::Cuda(dev)) =
            (&self.weight, x.device())
        {
            // An f32 weight (a mixture's router): candle's f32 matmul.
            if w.dtype() == candle_core::DType::F32 {
                return self.matmul(&x.to_dtype(candle_core::DType::F32)?);
            }
            let y = crate::model::cuda::gemm::matmul_f32_out(dev, &x.to_dtype(w.dtype())?, w)?;
            return self.add_bias(y);
        }
        if x.device().is_cuda() {
            return Ok(self
                .matmul(&x.to_dtype(candle_core::DType::F32)?)?
                .to_dtype(candle_core::DType::F32)?);
        }
        self.matmul(x)
    }

    /// `x` as host weights read it. CPU ranks compute in f32 throughout; 16-bit
    /// activations reach host weights only from a GPU-path rank emulated in tests, and are
    /// widened to the dense weights' type (f32 for quantized ones), so the product
    /// accumulates in f32 as cuBLAS does.
    fn host_input(&self, x: &Tensor) -> Result<Tensor> {
        if !x.device().is_cpu() || x.dtype() == candle_core::DType::F32 {
            return Ok(x.clone());
        }
        let want = match &self.weight {
            LinearWeight::Candle(QMatMul::Tensor(w)) => w.dtype(),
            _ => candle_core::DType::F32,
        };
        Ok(x.to_dtype(want)?)
    }

    /// On a CUDA rank, a quantized weight's product with 1 to 8 rows by our decode
    /// kernels where they were measured faster (`model::cuda::quant_matvec`), without the
    /// bias: f32 `[rows, out]`; `None` where candle's matmul takes it.
    fn quantized_decode(&self, x: &Tensor) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if let (LinearWeight::Candle(QMatMul::QTensor(w)), Device::Cuda(_)) =
            (&self.weight, x.device())
        {
            let gpu = crate::device::buffers::Gpu::of(x.device())?;
            return crate::model::cuda::quant_matvec::decode_product(gpu, x, w);
        }
        let _ = x;
        Ok(None)
    }

    /// `x`: `[tokens, in]` → `[tokens, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.quantized_decode(x)? {
            Some(y) => self.add_bias(y),
            None => self.matmul(x),
        }
    }

    /// The product by candle's matmul or Tessera's CPU kernels, bias added.
    fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        let x = &self.host_input(x)?;
        let y = match &self.weight {
            LinearWeight::Candle(w) => w.forward(x)?,
            LinearWeight::Kernel(w) => {
                let (m, _) = x.dims2()?;
                let y = cpu_ops::with_values(x, |xs| w.matmul(xs, m))?;
                Tensor::from_vec(y, (m, w.rows()), x.device())?
            }
        };
        self.add_bias(y)
    }

    /// `y + b`. The bias is kept in the device's compute type; a product in another type
    /// (an f32 router on a GPU, a quantized matmul's or a GEMM's f32 output) takes it in
    /// its own.
    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.bias {
            Some(b) if b.dtype() != y.dtype() => y.broadcast_add(&b.to_dtype(y.dtype())?)?,
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// A column-parallel layer over one or more fused segments (Q,K,V or gate,up). Fused into
/// a single matmul when every segment has the same representation.
#[derive(Debug, Clone)]
pub struct ColumnParallel {
    parts: Vec<Linear>,
    /// Output width of each segment on this rank.
    widths: Vec<usize>,
}

impl ColumnParallel {
    /// Loads segment `i` from `names[i]` (whole `[out_i, in]` matrices) and keeps `rank`'s
    /// rows of each according to `split` (one segment per name).
    pub fn load(
        matrices: &[Matrix],
        biases: Option<&[Tensor]>,
        split: &SplitState,
        rank: usize,
        device: &Device,
        fused_name: &str,
    ) -> Result<Self> {
        let SplitState::Split { axis: 0, segments } = split else {
            return Err(crate::error::EngineError::Parallel(format!(
                "{fused_name}: column-parallel layers split axis 0"
            )));
        };
        let mut shards = Vec::with_capacity(matrices.len());
        let mut widths = Vec::with_capacity(matrices.len());
        let mut bias_parts = Vec::new();
        for (i, (m, seg)) in matrices.iter().zip(segments).enumerate() {
            let range = seg.ranges[rank].clone();
            widths.push(range.len());
            if let Some(bs) = biases {
                bias_parts.push(bs[i].narrow(0, range.start, range.len())?);
            }
            shards.push(m.select_rows(&[range])?);
        }
        let bias = if bias_parts.is_empty() {
            None
        } else {
            Some(
                Tensor::cat(&bias_parts, 0)?
                    .to_device(device)?
                    .to_dtype(crate::device::dtype::compute_dtype(device))?,
            )
        };
        let parts = match Matrix::concat_rows(&shards, fused_name)? {
            Some(fused) => vec![Linear::new(LinearWeight::place(fused, device)?, bias)],
            None => {
                let mut parts = Vec::with_capacity(shards.len());
                let mut offset = 0;
                for (shard, w) in shards.into_iter().zip(&widths) {
                    let b = match &bias {
                        Some(b) => Some(b.narrow(0, offset, *w)?),
                        None => None,
                    };
                    offset += w;
                    parts.push(Linear::new(LinearWeight::place(shard, device)?, b));
                }
                parts
            }
        };
        Ok(Self { parts, widths })
    }

    /// The segments' weights as one dense matrix (`[Σ width_i, in]`), where they are one
    /// and have no bias.
    pub(crate) fn fused_dense_weight(&self) -> Option<&Tensor> {
        match self.parts.as_slice() {
            [fused] => fused.dense_weight(),
            _ => None,
        }
    }

    /// Outputs of each segment, `[tokens, width_i]`.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        if let [fused] = self.parts.as_slice() {
            let y = fused.forward(x)?;
            let mut outs = Vec::with_capacity(self.widths.len());
            let mut offset = 0;
            for w in &self.widths {
                outs.push(y.narrow(1, offset, *w)?);
                offset += w;
            }
            return Ok(outs);
        }
        self.parts.iter().map(|p| p.forward(x)).collect()
    }

    /// All segments' outputs side by side, `[tokens, Σ width_i]`.
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        if let [fused] = self.parts.as_slice() {
            return fused.forward(x);
        }
        let outs = self
            .parts
            .iter()
            .map(|p| p.forward(x)?.to_dtype(x.dtype()).map_err(Into::into))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&outs, 1)?)
    }

    /// Outputs of each segment as row-major `[tokens, width_i]` vectors.
    pub fn forward_vecs(&self, x: &Tensor) -> Result<Vec<Vec<f32>>> {
        if let [fused] = self.parts.as_slice() {
            let y = fused.forward(x)?;
            let mut offset = 0;
            return self
                .widths
                .iter()
                .map(|&w| {
                    offset += w;
                    cpu_ops::columns_to_vec(&y, offset - w, w)
                })
                .collect();
        }
        self.parts
            .iter()
            .zip(&self.widths)
            .map(|(p, &w)| cpu_ops::columns_to_vec(&p.forward(x)?, 0, w))
            .collect()
    }

    /// SiLU(gate) · up of a gate/up pair of segments, `[tokens, width]`.
    /// `act(gate) · up` of a gate/up pair (fused or two segments).
    pub fn forward_gated(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        match (self.parts.as_slice(), self.widths.as_slice()) {
            ([fused], &[gate, up]) if gate == up => {
                cpu_ops::gated_fused(&fused.forward(x)?, gate, act)
            }
            (_, [_, _]) => {
                let gu = self.forward(x)?;
                cpu_ops::gated(&gu[0], &gu[1], act)
            }
            _ => Err(crate::error::EngineError::Parallel(format!(
                "gate/up: expected two segments, found {}",
                self.widths.len()
            ))),
        }
    }

    pub fn widths(&self) -> &[usize] {
        &self.widths
    }
}

/// A row-parallel layer: this rank's input columns; the output is a partial sum.
pub fn row_parallel(
    matrix: &Matrix,
    split: &SplitState,
    rank: usize,
    device: &Device,
) -> Result<Linear> {
    let SplitState::Split { axis: 1, .. } = split else {
        return Err(crate::error::EngineError::Parallel(format!(
            "{}: row-parallel layers split axis 1",
            matrix.name()
        )));
    };
    let ranges = split.rank_ranges(rank).unwrap_or_default();
    let range = ranges.first().cloned().unwrap_or(0..0);
    Ok(Linear::new(
        LinearWeight::place(matrix.select_cols(range)?, device)?,
        None,
    ))
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QMatMul;
    use candle_core::{DType, Device, Tensor};

    use super::Linear;
    use crate::error::Result;
    use crate::model::linear_weight::LinearWeight;

    /// A bias kept in another type than the product (a GPU's bf16 bias beside an f32
    /// router) is added in the product's type.
    #[test]
    fn a_bias_in_another_type_is_added_in_the_products() -> Result<()> {
        let w = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu)?;
        let bias = Tensor::new(&[0.5f32, -1.0], &Device::Cpu)?.to_dtype(DType::BF16)?;
        let layer = Linear::new(LinearWeight::Candle(QMatMul::Tensor(w)), Some(bias));
        let x = Tensor::new(&[[1f32, 1.0]], &Device::Cpu)?;
        let y = layer.forward(&x)?;
        assert_eq!(y.dtype(), DType::F32);
        assert_eq!(y.to_vec2::<f32>()?, vec![vec![3.5, 6.0]]);
        Ok(())
    }
}
