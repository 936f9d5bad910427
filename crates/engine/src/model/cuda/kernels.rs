//! Launches of Tessera's own CUDA kernels (`kernels/cuda/*.cu`) on a GPU-path rank.
//!
//! Each function takes candle tensors, checks their dtypes and shapes, and launches the
//! kernel through [`Gpu::launch`]: on a CUDA device's stream (the calling thread's
//! per-thread stream), or emulated on the host in test builds, from the same argument
//! list. Element types are f16 or bf16 ([`KvDtype`]); rows are contiguous.

use candle_core::{DType, Tensor};
use tessera_kernels::gpu::launch::{
    attention_kernel, attention_shape, clamped_gate_kernel, gated_kernel, gated_shape,
    merge_kernel, merge_shape, norm_kernel, norm_shape, rope_write_kernel, rope_write_shape, Gate,
    KernelArg, KvDtype, TileLaunch, PREFILL_TILE,
};

use tessera_kernels::gpu::quantized::{quantized_attention_kernel, KvQuant};

use crate::device::buffers::{expect_dtype, Gpu, Held, Module};
use crate::device::dtype::candle_dtype;
use crate::error::{EngineError, Result};
use crate::model::cuda::kv_cache::KvLayer;
use crate::model::cuda::step_meta::StepMeta;
use crate::model::cuda::MlpGate;
use crate::model::step_meta::Part;
use crate::spec::model::Activation;

/// Checks that every tensor has the element type of `dtype`.
fn expect_all(dtype: KvDtype, tensors: &[(&Tensor, &str)]) -> Result<()> {
    tensors
        .iter()
        .try_for_each(|(t, what)| expect_dtype(t, candle_dtype(dtype), what))
}

pub(crate) fn i32_of(x: usize, what: &str) -> Result<KernelArg> {
    i32::try_from(x)
        .map(KernelArg::I32)
        .map_err(|_| EngineError::Step(format!("{what} {x} does not fit a kernel argument")))
}

/// RoPE tables on the device: `cos` and `sin`, f32 `[max_positions, head_dim / 2]`.
#[derive(Debug, Clone)]
pub struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
    pub interleaved: bool,
    /// Rotation pairs of the rotated part of a head (`head_dim / 2` unless partial).
    pub rotary_half: usize,
}

/// Geometry of this rank's attention.
#[derive(Debug, Clone, Copy)]
pub struct HeadLayout {
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl HeadLayout {
    /// Width of a fused QKV row.
    pub fn qkv_width(&self) -> usize {
        (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
    }
}

/// Rotates the queries and keys of `qkv` (`[tokens, qkv_width]`) for their positions,
/// in place for the queries, and writes rotated keys and the values into the cache slots
/// of `meta`.
#[allow(clippy::too_many_arguments)]
pub fn rope_write_kv(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &StepMeta,
    rope: &RopeTables,
    heads: HeadLayout,
) -> Result<()> {
    expect_all(dtype, &[(k_cache, "K cache"), (v_cache, "V cache")])?;
    rope_kv(gpu, dtype, qkv, Some((k_cache, v_cache)), meta, rope, heads)
}

/// Rotates the queries and keys of `qkv` in place, writing nothing to a cache (an 8-bit
/// cache's store reads the rotated keys from there).
pub fn rope_in_place(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    qkv: &Tensor,
    meta: &StepMeta,
    rope: &RopeTables,
    heads: HeadLayout,
) -> Result<()> {
    rope_kv(gpu, dtype, qkv, None, meta, rope, heads)
}

fn rope_kv(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    qkv: &Tensor,
    cache: Option<(&Tensor, &Tensor)>,
    meta: &StepMeta,
    rope: &RopeTables,
    heads: HeadLayout,
) -> Result<()> {
    expect_all(dtype, &[(qkv, "qkv")])?;
    let (n, width) = qkv.dims2()?;
    if width != heads.qkv_width() || n != meta.num_tokens {
        return Err(EngineError::Step(format!(
            "qkv is [{n}, {width}], expected [{}, {}]",
            meta.num_tokens,
            heads.qkv_width()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    expect_dtype(&rope.cos, DType::F32, "rope cos")?;
    expect_dtype(&rope.sin, DType::F32, "rope sin")?;
    if rope.rotary_half == 0 || 2 * rope.rotary_half > heads.head_dim {
        return Err(EngineError::Step(format!(
            "{} rotation pairs in a head of {}",
            rope.rotary_half, heads.head_dim
        )));
    }
    let held = [
        Held::new(qkv, "qkv")?,
        Held::new(&rope.cos, "rope cos")?,
        Held::new(&rope.sin, "rope sin")?,
    ];
    let cache_h = cache
        .map(|(k, v)| Ok::<_, EngineError>([Held::new(k, "K cache")?, Held::new(v, "V cache")?]))
        .transpose()?;
    // Null cache pointers: the keys rotate in place.
    let (k_arg, v_arg) = match &cache_h {
        Some([k, v]) => (k.arg()?, v.arg()?),
        None => (KernelArg::Ptr(0), KernelArg::Ptr(0)),
    };
    let meta_h = meta.held()?;
    let name = rope_write_kernel(dtype);
    let args = [
        held[0].arg()?,
        i32_of(width, "qkv width")?,
        k_arg,
        v_arg,
        meta.part(&meta_h, Part::Positions)?,
        meta.part(&meta_h, Part::Slots)?,
        held[1].arg()?,
        held[2].arg()?,
        i32_of(heads.num_q_heads, "query heads")?,
        i32_of(heads.num_kv_heads, "KV heads")?,
        i32_of(heads.head_dim, "head dim")?,
        KernelArg::I32(i32::from(rope.interleaved)),
        i32_of(rope.rotary_half, "rotation pairs")?,
    ];
    let shape = rope_write_shape(n, heads.num_q_heads, heads.num_kv_heads, heads.head_dim);
    // SAFETY: the arguments match the kernel's signature in kv_write.cu; every index the
    // kernel forms is within the buffers: token rows < n, slots < the cache's slots
    // (checked by `Batch::from_plan`), positions < the RoPE table (likewise).
    unsafe { gpu.launch(Module::KvWrite, &name, shape, &args) }
}

/// What a layer's attention reads and how it scales scores.
#[derive(Debug, Clone, Copy)]
pub struct LayerAttention<'a> {
    /// A sliding-window layer attends to its last `window` positions only.
    pub window: Option<usize>,
    /// Scores are `q · k · scale` (1/√head_dim unless the model says otherwise).
    pub scale: f32,
    /// Scores become `cap · tanh(score / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
    /// gpt-oss's sinks: one f32 logit per local query head (`[num_q_heads]` on the
    /// device) that joins its softmax and attends to nothing.
    pub sinks: Option<&'a Tensor>,
}

/// Attention of every token of the step over its sequence's cached context, or over its
/// last positions for a sliding-window layer. `qkv` holds the rotated queries (its first
/// `num_q_heads * head_dim` columns); returns `[tokens, num_q_heads * head_dim]`. The
/// cache holds `dtype`, or an 8-bit type with its scales.
pub fn paged_attention(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    qkv: &Tensor,
    cache: KvLayer<'_>,
    meta: &StepMeta,
    heads: HeadLayout,
    layer: LayerAttention<'_>,
) -> Result<Tensor> {
    expect_all(dtype, &[(qkv, "qkv")])?;
    let (k_cache, v_cache) = (cache.k, cache.v);
    let n = meta.num_tokens;
    let (hd, nq) = (heads.head_dim, heads.num_q_heads);
    check_cache(dtype, cache, meta.block_size, heads)?;
    if let Some(s) = layer.sinks {
        expect_dtype(s, DType::F32, "attention sinks")?;
        if s.dims() != [nq] {
            return Err(EngineError::Step(format!(
                "attention sinks are {:?}, expected [{nq}]",
                s.dims()
            )));
        }
    }
    let out_width = nq * hd;
    // Every row of the output is written: each token is in exactly one tile.
    let out = gpu.output(candle_dtype(dtype), (n, out_width))?;
    if n == 0 {
        return Ok(out);
    }
    let held = [
        Held::new(&out, "attention output")?,
        Held::new(qkv, "qkv")?,
        Held::new(k_cache, "K cache")?,
        Held::new(v_cache, "V cache")?,
    ];
    let sinks_h = layer
        .sinks
        .map(|s| Held::new(s, "attention sinks"))
        .transpose()?;
    let scales_h = cache
        .quant
        .map(|(_, k, v)| {
            Ok::<_, EngineError>([Held::new(k, "K scales")?, Held::new(v, "V scales")?])
        })
        .transpose()?;
    let scales = match &scales_h {
        Some([k, v]) => Some((k.arg()?, v.arg()?)),
        None => None,
    };
    let meta_h = meta.held()?;
    let common = AttentionArgs {
        out: held[0].arg()?,
        q: held[1].arg()?,
        k: held[2].arg()?,
        v: held[3].arg()?,
        quant: cache.quant.map(|(q, _, _)| q),
        scales,
        positions: meta.part(&meta_h, Part::Positions)?,
        seq_of_token: meta.part(&meta_h, Part::SeqOfToken)?,
        block_tables: meta.part(&meta_h, Part::BlockTables)?,
        kv_of_q: meta.part(&meta_h, Part::KvOfQ)?,
        max_blocks: i32_of(meta.max_blocks, "blocks per sequence")?,
        q_stride: i32_of(heads.qkv_width(), "qkv width")?,
        out_stride: i32_of(out_width, "output width")?,
        nq: i32_of(nq, "query heads")?,
        nkv: i32_of(heads.num_kv_heads, "KV heads")?,
        block_size: i32_of(meta.block_size, "block size")?,
        scale: KernelArg::F32(layer.scale),
        // 0: the whole context.
        window: i32_of(layer.window.unwrap_or(0), "attention window")?,
        // 0: no cap.
        softcap: KernelArg::F32(layer.softcap.unwrap_or(0.0)),
        // Null: no sinks.
        sinks: match &sinks_h {
            Some(h) => h.arg()?,
            None => KernelArg::Ptr(0),
        },
    };
    // A sliding layer's decode partitions split its window, not the whole context.
    let decode = match layer.window {
        Some(w) => std::borrow::Cow::Owned(meta.plan.decode.decode_windowed(w)),
        None => std::borrow::Cow::Borrowed(&meta.plan.decode),
    };
    for (launch, tile, tiles) in [
        (decode.as_ref(), 1, [Part::DecodeStart, Part::DecodeLen]),
        (
            &meta.plan.prefill,
            PREFILL_TILE,
            [Part::PrefillStart, Part::PrefillLen],
        ),
    ] {
        if launch.is_empty() {
            continue;
        }
        let tiles = (meta.part(&meta_h, tiles[0])?, meta.part(&meta_h, tiles[1])?);
        launch_tiles(gpu, dtype, (nq, hd), tile, launch, tiles, &common)?;
    }
    drop(held);
    drop((sinks_h, scales_h));
    Ok(out)
}

/// Checks a cache layer's element types and sizes before the kernels read or write it:
/// `dtype` (or bytes, for an 8-bit cache) of whole blocks, and as many scales as its type
/// has. Its number of blocks.
pub(crate) fn check_cache(
    dtype: KvDtype,
    cache: KvLayer<'_>,
    block_size: usize,
    heads: HeadLayout,
) -> Result<usize> {
    let elem = match cache.quant {
        Some(_) => DType::U8,
        None => candle_dtype(dtype),
    };
    expect_dtype(cache.k, elem, "K cache")?;
    expect_dtype(cache.v, elem, "V cache")?;
    let per_block = block_size * heads.num_kv_heads * heads.head_dim;
    let blocks = cache.k.elem_count() / per_block.max(1);
    if cache.v.elem_count() != cache.k.elem_count() || blocks * per_block != cache.k.elem_count() {
        return Err(EngineError::Step(format!(
            "K and V caches of {} and {} values for blocks of {per_block}",
            cache.k.elem_count(),
            cache.v.elem_count()
        )));
    }
    if let Some((q, k, v)) = cache.quant {
        let want = q.scales_len(blocks, heads.num_kv_heads);
        for (s, what) in [(k, "K scales"), (v, "V scales")] {
            expect_dtype(s, DType::F32, what)?;
            if s.elem_count() != want {
                return Err(EngineError::Step(format!(
                    "{what}: {} for a cache that has {want}",
                    s.elem_count()
                )));
            }
        }
    }
    Ok(blocks)
}

/// Arguments shared by the decode and prefill launches of one attention call.
struct AttentionArgs {
    out: KernelArg,
    q: KernelArg,
    k: KernelArg,
    v: KernelArg,
    /// An 8-bit cache's type, and its K and V scales.
    quant: Option<KvQuant>,
    scales: Option<(KernelArg, KernelArg)>,
    positions: KernelArg,
    seq_of_token: KernelArg,
    block_tables: KernelArg,
    kv_of_q: KernelArg,
    max_blocks: KernelArg,
    q_stride: KernelArg,
    out_stride: KernelArg,
    nq: KernelArg,
    nkv: KernelArg,
    block_size: KernelArg,
    scale: KernelArg,
    window: KernelArg,
    softcap: KernelArg,
    sinks: KernelArg,
}

fn launch_tiles(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    (nq, hd): (usize, usize),
    tile: usize,
    launch: &TileLaunch,
    tiles: (KernelArg, KernelArg),
    a: &AttentionArgs,
) -> Result<()> {
    let num_tiles = launch.num_tiles();
    let parts = launch.partitions.max(1);
    // Partial results of split contexts; every partition writes its entries (one
    // element when the context is not split: no empty buffers).
    let partials = if parts > 1 { num_tiles * nq * parts } else { 1 };
    let part_ms = gpu.output(DType::F32, partials * 2)?;
    let part_acc = gpu.output(DType::F32, partials * hd)?;
    let partial_h = [
        Held::new(&part_ms, "partition maxima and sums")?,
        Held::new(&part_acc, "partition accumulators")?,
    ];
    let (ms, acc) = (partial_h[0].arg()?, partial_h[1].arg()?);
    let name = match a.quant {
        Some(q) => quantized_attention_kernel(dtype, q, hd, tile),
        None => attention_kernel(dtype, hd, tile),
    };
    let mut args = vec![a.out, a.out_stride, ms, acc, a.q, a.q_stride, a.k, a.v];
    // 8-bit caches: their scales follow the cache pointers.
    if let Some((k, v)) = a.scales {
        args.extend([k, v]);
    }
    args.extend([
        a.positions,
        tiles.0,
        tiles.1,
        a.seq_of_token,
        a.block_tables,
        a.max_blocks,
        a.kv_of_q,
        a.nq,
        a.nkv,
        a.block_size,
        a.scale,
        i32_of(launch.partition_size, "partition size")?,
        a.window,
        a.softcap,
        a.sinks,
    ]);
    // SAFETY: the arguments match attention.cu's signature; tiles, positions, block
    // tables and kv_of_q come from `StepMeta`, which checks them against the cache; the
    // scales cover the cache's blocks (`check_cache`).
    unsafe { gpu.launch(Module::Attention, &name, attention_shape(nq, launch), &args) }?;
    if parts > 1 {
        let name = merge_kernel(dtype, hd);
        let args = [
            a.out,
            a.out_stride,
            ms,
            acc,
            tiles.0,
            a.nq,
            i32_of(parts, "partitions")?,
            a.sinks,
        ];
        // SAFETY: as above; the partial buffers hold `num_tiles * nq * parts` entries.
        unsafe { gpu.launch(Module::Attention, &name, merge_shape(nq, launch, hd), &args) }?;
    }
    Ok(())
}

/// The gated activation of a fused `[rows, 2 * width]` gate/up output: `[rows, width]`.
pub fn gated_mul(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    gate_up: &Tensor,
    width: usize,
    gate: MlpGate,
) -> Result<Tensor> {
    expect_all(dtype, &[(gate_up, "gate/up")])?;
    let (rows, cols) = gate_up.dims2()?;
    if cols != 2 * width {
        return Err(EngineError::Step(format!(
            "gate/up is {cols} wide, expected 2 x {width}"
        )));
    }
    let total = rows * width;
    // The kernel writes every one of the `total` elements.
    let out = gpu.output(candle_dtype(dtype), (rows, width))?;
    if total == 0 {
        return Ok(out);
    }
    let held = [
        Held::new(&out, "gated output")?,
        Held::new(gate_up, "gate/up")?,
    ];
    let mut args = vec![
        held[0].arg()?,
        held[1].arg()?,
        i32_of(width, "width")?,
        KernelArg::Usize(total),
    ];
    let name = match gate {
        MlpGate::Plain(Activation::Silu) => gated_kernel(dtype, Gate::Silu),
        MlpGate::Plain(Activation::GeluTanh) => gated_kernel(dtype, Gate::GeluTanh),
        MlpGate::Clamped(c) => {
            args.extend([KernelArg::F32(c.alpha), KernelArg::F32(c.limit)]);
            clamped_gate_kernel(dtype)
        }
    };
    // SAFETY: matches activations.cu; a grid-stride loop covers `total` elements.
    unsafe { gpu.launch(Module::Activations, &name, gated_shape(total), &args) }?;
    drop(held);
    Ok(out)
}

/// `x + delta` (f32, `[rows, cols]`; `x` alone when `delta` is `None`) and its RMSNorm
/// with weight `w` (f32, `[cols]`) in the matmul input type, in one kernel:
/// returns `(x + delta, norm)`.
pub fn add_rms_norm(
    gpu: Gpu<'_>,
    dtype: KvDtype,
    x: &Tensor,
    delta: Option<&Tensor>,
    w: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let (rows, cols) = x.dims2()?;
    expect_dtype(x, DType::F32, "residual")?;
    expect_dtype(w, DType::F32, "norm weight")?;
    if w.dims1()? != cols {
        return Err(EngineError::Step(format!(
            "norm weight has {} values for rows of {cols}",
            w.dims1()?
        )));
    }
    if let Some(d) = delta {
        expect_dtype(d, DType::F32, "residual delta")?;
        if d.dims2()? != (rows, cols) {
            return Err(EngineError::Step(format!(
                "residual delta is {:?}, the residual [{rows}, {cols}]",
                d.dims()
            )));
        }
    }
    // The kernel writes every element of both outputs.
    let x_out = gpu.output(DType::F32, (rows, cols))?;
    let h = gpu.output(candle_dtype(dtype), (rows, cols))?;
    if rows > 0 {
        let held = [
            Held::new(&x_out, "residual out")?,
            Held::new(&h, "norm out")?,
            Held::new(x, "residual")?,
            Held::new(w, "norm weight")?,
        ];
        let delta_h = delta.map(|d| Held::new(d, "residual delta")).transpose()?;
        let args = [
            held[0].arg()?,
            held[1].arg()?,
            held[2].arg()?,
            // A null pointer: the kernel adds nothing.
            delta_h
                .as_ref()
                .map(Held::arg)
                .transpose()?
                .unwrap_or(KernelArg::Ptr(0)),
            held[3].arg()?,
            i32_of(cols, "hidden size")?,
            KernelArg::F32(eps),
        ];
        // SAFETY: matches norm.cu; every pointer covers rows x cols (w: cols) elements.
        unsafe {
            gpu.launch(
                Module::Norm,
                &norm_kernel(dtype),
                norm_shape(rows, cols),
                &args,
            )
        }?;
    }
    Ok((x_out, h))
}
