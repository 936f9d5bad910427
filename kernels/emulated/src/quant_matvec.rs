//! The quantized decode products of `cuda/quant_matvec.cu`, launched as the engine would
//! launch them (`tessera_kernels::gpu::quant_matvec`): activations to int8 blocks, then
//! the product over the GGUF blocks.

use half::bf16;
use tessera_kernels::gpu::quant_matvec::{
    check_matvec, quant_matvec_kernel, quant_matvec_shape, quantize_act_kernel, quantize_act_shape,
    ActDtype, GgufQuant, Q8_ACT_BYTES, Q8_BLOCK,
};

use crate::{arg_int, at_least, launch, ptr, EmuError, Result};

/// Activations the quantize kernel reads.
#[derive(Debug, Clone, Copy)]
pub enum Activations<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

impl Activations<'_> {
    fn len(&self) -> usize {
        match self {
            Activations::F32(x) => x.len(),
            Activations::Bf16(x) => x.len(),
        }
    }
}

/// `y[rows, n] = x[rows, k] · Wᵀ` with `W` `n` rows of GGUF blocks (`weights`), `rows` =
/// `x.len() / k`, 1 to 8.
pub fn quant_matvec(
    quant: GgufQuant,
    weights: &[u8],
    x: Activations<'_>,
    n: usize,
    k: usize,
) -> Result<Vec<f32>> {
    let rows = x.len() / k.max(1);
    check_matvec(quant, rows, n, k).map_err(EmuError::Size)?;
    at_least(x.len(), rows * k, "activations")?;
    at_least(weights.len(), quant.weight_bytes(n, k), "weights")?;
    // u32 words keep the blocks 4-byte aligned, as a device allocation is.
    let mut acts = vec![0u32; rows * (k / Q8_BLOCK) * Q8_ACT_BYTES / 4];
    let (name, src) = match x {
        Activations::F32(v) => (quantize_act_kernel(ActDtype::F32), ptr(v.as_ptr())),
        Activations::Bf16(v) => (quantize_act_kernel(ActDtype::Bf16), ptr(v.as_ptr())),
    };
    let args = [src, ptr(acts.as_mut_ptr()), arg_int(k, "k")?];
    // SAFETY: `rows * k` activations in, one 40-byte block per 32 of them out.
    unsafe { launch(&name, quantize_act_shape(rows, k), &args) }?;
    let mut w = vec![0u32; weights.len().div_ceil(4)];
    // SAFETY: `w` holds at least `weights.len()` bytes; u8 has no alignment.
    unsafe {
        std::ptr::copy_nonoverlapping(weights.as_ptr(), w.as_mut_ptr().cast::<u8>(), weights.len())
    };
    let mut y = vec![0f32; rows * n];
    let args = [
        ptr(w.as_ptr()),
        ptr(acts.as_ptr()),
        ptr(y.as_mut_ptr()),
        arg_int(n, "n")?,
        arg_int(k, "k")?,
    ];
    // SAFETY: `n` rows of `k / block_elems` blocks, `rows` rows of activation blocks,
    // `rows * n` outputs (checked above).
    unsafe {
        launch(
            &quant_matvec_kernel(quant, rows),
            quant_matvec_shape(n),
            &args,
        )
    }?;
    Ok(y)
}

/// The activation blocks `quantize_q8_act_f32` writes for `x` (rows of `k`), as bytes.
pub fn quantize_activations(x: &[f32], k: usize) -> Result<Vec<u8>> {
    let rows = x.len() / k.max(1);
    if k == 0 || !k.is_multiple_of(Q8_BLOCK) || rows == 0 {
        return Err(EmuError::Size(format!(
            "{} activations in rows of {k}",
            x.len()
        )));
    }
    let mut acts = vec![0u32; rows * (k / Q8_BLOCK) * Q8_ACT_BYTES / 4];
    let args = [ptr(x.as_ptr()), ptr(acts.as_mut_ptr()), arg_int(k, "k")?];
    // SAFETY: as in `quant_matvec`.
    unsafe {
        launch(
            &quantize_act_kernel(ActDtype::F32),
            quantize_act_shape(rows, k),
            &args,
        )
    }?;
    Ok(acts.iter().flat_map(|w| w.to_le_bytes()).collect())
}
