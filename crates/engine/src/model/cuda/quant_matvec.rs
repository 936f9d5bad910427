//! Decode-time products over GGUF-quantized weights with our kernels
//! (`kernels/cuda/quant_matvec.cu`): for 1 to 8 activation rows, the activations become
//! int8 blocks in one launch and one warp per output column reads each weight block once
//! for all rows in a second. Larger batches, and weight types the kernels do not take, stay
//! on candle's quantized matmul.
//!
//! Ours take a product only where they were measured faster than candle's
//! ([`measured_faster`]); `TESSERA_QUANT_MATVEC=candle` keeps every product on candle's
//! and `TESSERA_QUANT_MATVEC=ours` gives ours every product they can take, for
//! benchmarking the two side by side (`scripts/bench-gpu`).

use std::sync::OnceLock;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};
use tessera_kernels::gpu::launch::KernelArg;
use tessera_kernels::gpu::quant_matvec::{
    check_matvec, quant_matvec_kernel, quant_matvec_shape, quantize_act_kernel, quantize_act_shape,
    ActDtype, GgufQuant, MAX_ROWS, Q8_ACT_BYTES, Q8_BLOCK,
};

use crate::device::buffers::{Gpu, Held, Module};
use crate::error::{EngineError, Result};
use crate::model::cuda::kernels::i32_of;

/// The variable that chooses between our kernels and candle's matmul.
pub const SWITCH_VARIABLE: &str = "TESSERA_QUANT_MATVEC";

/// Who takes the quantized decode products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    /// Ours where [`measured_faster`] says so (the default).
    Measured,
    /// Candle's for every product (`TESSERA_QUANT_MATVEC=candle`).
    Candle,
    /// Ours for every product they take (`TESSERA_QUANT_MATVEC=ours`).
    Ours,
}

/// The choice `TESSERA_QUANT_MATVEC` makes, read once.
fn choice() -> Choice {
    static CHOICE: OnceLock<Choice> = OnceLock::new();
    *CHOICE.get_or_init(|| {
        let choice = match std::env::var(SWITCH_VARIABLE).as_deref() {
            Ok("candle") => Choice::Candle,
            Ok("ours") => Choice::Ours,
            Ok(other) if !other.is_empty() => {
                tracing::warn!(
                    "{SWITCH_VARIABLE}={other} is not `candle` or `ours`: the measured choice \
                     stands"
                );
                Choice::Measured
            }
            _ => Choice::Measured,
        };
        if choice != Choice::Measured {
            tracing::info!("{SWITCH_VARIABLE}: quantized decode products by {choice:?}");
        }
        choice
    })
}

/// Where our kernels beat candle's: the time of both, summed over the Llama-3.1-8B decode
/// products (4096 x 4096, 14336 x 4096 and 4096 x 14336), on an H200 at commit 136f469
/// (`tessera-gpu-check quant_matvec::quantized_matvec_timing_against_candle`; the table is
/// in docs/benchmarks.md). Ours won for Q4_1 and Q4_K at one row (by 8% and 4%) and for
/// Q4_K and Q6_K at eight (4% and 15%); candle's won everywhere else, by up to 40%.
pub fn measured_faster(quant: GgufQuant, rows: usize) -> bool {
    matches!(
        (quant, rows),
        (GgufQuant::Q4_1, 1) | (GgufQuant::Q4K, 1) | (GgufQuant::Q4K, 8) | (GgufQuant::Q6K, 8)
    )
}

/// The product of [`quant_matvec`] where our kernels are chosen for it (see [`choice`]);
/// `None` leaves it to candle's matmul.
pub fn decode_product(gpu: Gpu<'_>, x: &Tensor, w: &QTensor) -> Result<Option<Tensor>> {
    let Some(quant) = quant_of(w.dtype()) else {
        return Ok(None);
    };
    let take = match choice() {
        Choice::Candle => false,
        Choice::Ours => true,
        Choice::Measured => measured_faster(quant, x.dims2()?.0),
    };
    if !take {
        return Ok(None);
    }
    quant_matvec(gpu, x, w)
}

/// The kernels' name for a GGUF type they take.
fn quant_of(dtype: GgmlDType) -> Option<GgufQuant> {
    match dtype {
        GgmlDType::Q4_0 => Some(GgufQuant::Q4_0),
        GgmlDType::Q4_1 => Some(GgufQuant::Q4_1),
        GgmlDType::Q8_0 => Some(GgufQuant::Q8_0),
        GgmlDType::Q4K => Some(GgufQuant::Q4K),
        GgmlDType::Q5K => Some(GgufQuant::Q5K),
        GgmlDType::Q6K => Some(GgufQuant::Q6K),
        _ => None,
    }
}

/// `x · Wᵀ` (f32 `[rows, n]`) for `x` `[rows, k]` (f32 or bf16) and `W` `[n, k]`, when our
/// kernels take it: `None` for more than [`MAX_ROWS`] rows, another weight type or element
/// type, or a `k` that is not a whole number of blocks.
pub fn quant_matvec(gpu: Gpu<'_>, x: &Tensor, w: &QTensor) -> Result<Option<Tensor>> {
    let Some(quant) = quant_of(w.dtype()) else {
        return Ok(None);
    };
    let act = match x.dtype() {
        DType::F32 => ActDtype::F32,
        DType::BF16 => ActDtype::Bf16,
        _ => return Ok(None),
    };
    let (rows, k) = x.dims2()?;
    let (n, wk) = w.shape().dims2()?;
    if rows > MAX_ROWS || wk != k || check_matvec(quant, rows.max(1), n, k).is_err() {
        return Ok(None);
    }
    let y = gpu.output(DType::F32, (rows, n))?;
    if rows == 0 {
        return Ok(Some(y));
    }
    let x = x.contiguous()?;
    // One 40-byte block per 32 activations, as u32 words (4-byte aligned, as the kernels
    // read them); the quantize launch writes all of it.
    let acts = gpu.output(DType::U32, rows * (k / Q8_BLOCK) * Q8_ACT_BYTES / 4)?;
    let weights = WeightBytes::of(gpu, w, quant)?;
    let held = [
        Held::new(&x, "quantized matvec input")?,
        Held::new(&acts, "quantized activations")?,
        Held::new(&y, "quantized matvec output")?,
    ];
    let k_arg = i32_of(k, "k")?;
    let args = [held[0].arg()?, held[1].arg()?, k_arg];
    // SAFETY: matches quant_matvec.cu: `x` holds rows × k activations, `acts` one block
    // per 32 of them; the grid covers rows × k / 32 blocks.
    unsafe {
        gpu.launch(
            Module::QuantMatvec,
            &quantize_act_kernel(act),
            quantize_act_shape(rows, k),
            &args,
        )
    }?;
    let args = [
        weights.arg(),
        held[1].arg()?,
        held[2].arg()?,
        i32_of(n, "n")?,
        k_arg,
    ];
    // SAFETY: `W` holds n rows of k / block weights' blocks (checked against its size),
    // `y` rows × n floats; one warp per output column.
    unsafe {
        gpu.launch(
            Module::QuantMatvec,
            &quant_matvec_kernel(quant, rows),
            quant_matvec_shape(n),
            &args,
        )
    }?;
    drop(held);
    Ok(Some(y))
}

/// The weight's blocks where the kernel reads them: the QTensor's device buffer on CUDA;
/// in emulated test builds a 4-byte-aligned host copy.
enum WeightBytes {
    #[cfg(feature = "cuda")]
    Device(u64),
    #[cfg(feature = "gpu-emulation")]
    Host(Vec<u32>),
}

impl WeightBytes {
    fn of(gpu: Gpu<'_>, w: &QTensor, quant: GgufQuant) -> Result<Self> {
        let (n, k) = w.shape().dims2()?;
        let want = quant.weight_bytes(n, k);
        if w.storage_size_in_bytes() < want {
            return Err(EngineError::Step(format!(
                "quantized weight of {} bytes for {n} x {k} {:?} ({want} bytes)",
                w.storage_size_in_bytes(),
                w.dtype()
            )));
        }
        match gpu.device() {
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(_) => Ok(Self::Device(w.device_ptr()? as u64)),
            #[cfg(feature = "gpu-emulation")]
            candle_core::Device::Cpu => {
                let bytes = w.data()?;
                let mut words = vec![0u32; bytes.len().div_ceil(4)];
                for (word, chunk) in words.iter_mut().zip(bytes.chunks(4)) {
                    let mut b = [0u8; 4];
                    b[..chunk.len()].copy_from_slice(chunk);
                    *word = u32::from_le_bytes(b);
                }
                Ok(Self::Host(words))
            }
            _ => Err(EngineError::Step(
                "quantized matvec: the weight is not on a GPU-path device".into(),
            )),
        }
    }

    fn arg(&self) -> KernelArg {
        match self {
            #[cfg(feature = "cuda")]
            Self::Device(p) => KernelArg::Ptr(*p),
            #[cfg(feature = "gpu-emulation")]
            Self::Host(words) => KernelArg::Ptr(words.as_ptr() as u64),
        }
    }
}

#[cfg(all(test, feature = "gpu-emulation"))]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{DType, Device, Tensor};
    use tessera_kernels::gpu::reference::Lcg;

    use super::{decode_product, quant_matvec};
    use crate::device::buffers::Gpu;

    fn rel_l2(a: &[f32], b: &[f32]) -> f32 {
        let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let n: f32 = b.iter().map(|y| y * y).sum();
        (d / n).sqrt()
    }

    /// The emulated launches against the product of the dequantized weights: only the
    /// int8 rounding of the activations apart (about 0.5%), for every type and row count,
    /// f32 and bf16 activations.
    #[test]
    fn emulated_launches_match_the_dequantized_product() {
        let (n, k) = (48, 512);
        let gpu = Gpu::of(&Device::Cpu).expect("emulated GPU");
        for dtype in [
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            let w = Tensor::from_vec(Lcg(7).values(n * k), (n, k), &Device::Cpu).expect("w");
            let q = QTensor::quantize(&w, dtype).expect("quantize");
            let dense = q.dequantize(&Device::Cpu).expect("dequantize");
            for rows in [1, 3, 8] {
                let x =
                    Tensor::from_vec(Lcg(rows as u64).values(rows * k), (rows, k), &Device::Cpu)
                        .expect("x");
                let want: Vec<f32> = x
                    .matmul(&dense.t().expect("t"))
                    .and_then(|y| y.flatten_all())
                    .and_then(|y| y.to_vec1())
                    .expect("reference");
                for act in [DType::F32, DType::BF16] {
                    let xa = x.to_dtype(act).expect("cast");
                    let y = quant_matvec(gpu, &xa, &q)
                        .expect("launch")
                        .unwrap_or_else(|| panic!("{dtype:?} x {rows} rows not taken"));
                    assert_eq!(y.dims(), [rows, n]);
                    let got: Vec<f32> = y.flatten_all().and_then(|y| y.to_vec1()).expect("y");
                    let err = rel_l2(&got, &want);
                    assert!(err < 2e-2, "{dtype:?}, {rows} rows, {act:?}: rel L2 {err}");
                }
            }
        }
    }

    /// More rows than the kernels take, another type, and a `k` of no whole blocks stay
    /// on candle's matmul.
    #[test]
    fn what_the_kernels_do_not_take_is_left_to_candle() {
        let gpu = Gpu::of(&Device::Cpu).expect("emulated GPU");
        let w = Tensor::from_vec(Lcg(3).values(16 * 256), (16, 256), &Device::Cpu).expect("w");
        let q4 = QTensor::quantize(&w, GgmlDType::Q4_1).expect("q4_1");
        let q5 = QTensor::quantize(&w, GgmlDType::Q5_0).expect("q5_0");
        let x9 = Tensor::zeros((9, 256), DType::F32, &Device::Cpu).expect("x");
        let x1 = Tensor::zeros((1, 256), DType::F32, &Device::Cpu).expect("x");
        assert!(quant_matvec(gpu, &x9, &q4).expect("nine rows").is_none());
        assert!(quant_matvec(gpu, &x1, &q5).expect("q5_0").is_none());
        assert!(quant_matvec(gpu, &x1, &q4).expect("one row").is_some());
    }

    /// By default the engine's decode products go to our kernels only where they were
    /// measured faster: Q4_1 at one row, not at two; Q4_0 never.
    #[test]
    fn the_engine_takes_ours_only_where_they_were_measured_faster() {
        let gpu = Gpu::of(&Device::Cpu).expect("emulated GPU");
        let w = Tensor::from_vec(Lcg(5).values(16 * 256), (16, 256), &Device::Cpu).expect("w");
        let q4_1 = QTensor::quantize(&w, GgmlDType::Q4_1).expect("q4_1");
        let q4_0 = QTensor::quantize(&w, GgmlDType::Q4_0).expect("q4_0");
        let x = |rows| Tensor::zeros((rows, 256), DType::F32, &Device::Cpu).expect("x");
        assert!(decode_product(gpu, &x(1), &q4_1).expect("q4_1").is_some());
        assert!(decode_product(gpu, &x(2), &q4_1).expect("q4_1").is_none());
        assert!(decode_product(gpu, &x(1), &q4_0).expect("q4_0").is_none());
        assert!(quant_matvec(gpu, &x(1), &q4_0).expect("q4_0").is_some());
    }
}
