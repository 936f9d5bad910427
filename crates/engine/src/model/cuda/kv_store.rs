//! A step's keys and values into a CUDA rank's cache, of any type it holds: the
//! activation dtype in one kernel (RoPE and the copy), an 8-bit type in two or three
//! (`tessera_kernels::gpu::quantized`): RoPE rotates the keys in place, a layer's first
//! fp8 write sets its scales, then the store quantizes keys and values into the cache.

use candle_core::Tensor;
use tessera_kernels::gpu::launch::KvDtype;
use tessera_kernels::gpu::quantized::{
    fp8_scales_kernel, fp8_scales_shape, kv_store_kernel, kv_store_shape, KvQuant,
};

use crate::device::buffers::{expect_dtype, Gpu, Held, Module};
use crate::device::dtype::candle_dtype;
use crate::error::{EngineError, Result};
use crate::model::cuda::kernels::{
    check_cache, i32_of, rope_in_place, rope_write_kv, HeadLayout, RopeTables,
};
use crate::model::cuda::kv_cache::CudaKvCache;
use crate::model::cuda::step_meta::StepMeta;
use crate::model::step_meta::Part;

/// Rotates the queries and keys of `qkv` (`[tokens, qkv_width]`, queries in place) and
/// writes the rotated keys and the values into layer `layer` of `cache`, at the slots of
/// `meta`.
#[allow(clippy::too_many_arguments)]
pub fn write_kv(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    qkv: &Tensor,
    cache: &mut CudaKvCache,
    layer: usize,
    meta: &StepMeta,
    rope: &RopeTables,
    heads: HeadLayout,
) -> Result<()> {
    let Some(l) = cache.layer(layer) else {
        return Err(EngineError::Step(format!(
            "layer {layer} of a cache of {}",
            cache.num_layers()
        )));
    };
    let Some((quant, k_scales, v_scales)) = l.quant else {
        return rope_write_kv(gpu, dtype, qkv, l.k, l.v, meta, rope, heads);
    };
    rope_in_place(gpu, dtype, qkv, meta, rope, heads)?;
    let n = meta.num_tokens;
    if n == 0 {
        return Ok(());
    }
    let blocks = check_cache(dtype, l, meta.block_size, heads)?;
    if blocks != cache.num_blocks {
        return Err(EngineError::Step(format!(
            "a cache layer of {blocks} blocks in a cache of {}",
            cache.num_blocks
        )));
    }
    expect_dtype(qkv, candle_dtype(dtype), "qkv")?;
    let held = [
        Held::new(qkv, "qkv")?,
        Held::new(l.k, "K cache")?,
        Held::new(l.v, "V cache")?,
        Held::new(k_scales, "K scales")?,
        Held::new(v_scales, "V scales")?,
    ];
    let meta_h = meta.held()?;
    let qkv_stride = i32_of(heads.qkv_width(), "qkv width")?;
    let (nq, nkv, hd) = (
        i32_of(heads.num_q_heads, "query heads")?,
        i32_of(heads.num_kv_heads, "KV heads")?,
        i32_of(heads.head_dim, "head dim")?,
    );
    let tokens = i32_of(n, "tokens")?;
    let needs_scales = cache.needs_scales(layer);
    if quant == KvQuant::Fp8 && needs_scales {
        let args = [
            held[0].arg()?,
            qkv_stride,
            held[3].arg()?,
            held[4].arg()?,
            tokens,
            nq,
            nkv,
            hd,
        ];
        // SAFETY: matches kv_write.cu's kv_fp8_scales; it reads the n rows of qkv's K
        // and V columns and writes one scale per KV head of each.
        unsafe {
            gpu.launch(
                Module::KvWrite,
                &fp8_scales_kernel(dtype),
                fp8_scales_shape(heads.num_kv_heads),
                &args,
            )
        }?;
    }
    let mut args = vec![
        held[0].arg()?,
        qkv_stride,
        held[1].arg()?,
        held[2].arg()?,
        held[3].arg()?,
        held[4].arg()?,
        meta.part(&meta_h, Part::Slots)?,
    ];
    match quant {
        KvQuant::Int8 => args.extend([tokens, nq, nkv, hd, i32_of(meta.block_size, "block size")?]),
        KvQuant::Fp8 => args.extend([nq, nkv, hd]),
    }
    let shape = kv_store_shape(quant, n, heads.num_kv_heads, heads.head_dim);
    // SAFETY: matches kv_write.cu's kv_store kernels; the slots are inside the cache
    // (`Batch::from_plan`), whose size and scales were checked above.
    unsafe {
        gpu.launch(
            Module::KvWrite,
            &kv_store_kernel(dtype, quant),
            shape,
            &args,
        )
    }?;
    drop((held, meta_h));
    if needs_scales {
        cache.scales_set(layer);
    }
    Ok(())
}
