//! Launches of Tessera's own CUDA kernels (`kernels/cuda/*.cu`) on a rank's device.
//!
//! Each function takes candle tensors, checks their dtypes and shapes, and queues the
//! kernel on the device's stream (the calling thread's per-thread stream). Element types
//! are f16 or bf16 ([`KvDtype`]); rows are contiguous.

use candle_core::cuda::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda::CudaDType;
use candle_core::{CudaDevice, DType, Tensor};
use tessera_kernels::gpu::launch::{
    argmax_shape, attention_kernel, attention_shape, candidate_rows, candidate_slots_used,
    column_of_key, gated_kernel, gated_shape, merge_kernel, merge_shape, norm_kernel, norm_shape,
    rope_write_kernel, rope_write_shape, CandidateRow, Gate, KvDtype, LaunchShape, TileLaunch,
    ARGMAX_KERNEL, CANDIDATES_KERNEL, MAX_CANDIDATES, PREFILL_TILE,
};
use tessera_kernels::gpu::ptx;

use crate::config::Activation;
use crate::error::{EngineError, Result};
use crate::model::cuda::buffers::{expect_dtype, wrap, Held};
use crate::model::cuda::step_meta::StepMeta;

fn launch_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Step(format!("CUDA kernel {what}: {e}"))
}

/// The kernel `$name` of module `$module` (loaded into the device once).
macro_rules! func {
    ($dev:expr, $module:expr, $ptx:expr, $name:expr) => {
        $dev.get_or_load_custom_func($name, $module, $ptx)
            .map_err(|e| launch_err($name, e))
    };
}

/// `$body` with the type `$t` standing for the element type of `$dtype`.
macro_rules! with_element {
    ($dtype:expr, $t:ident => $body:block) => {
        match $dtype {
            KvDtype::Bf16 => {
                type $t = half::bf16;
                $body
            }
            KvDtype::F16 => {
                type $t = half::f16;
                $body
            }
        }
    };
}

/// Checks that every tensor has the element type of `dtype`.
fn expect_all(dtype: KvDtype, tensors: &[(&Tensor, &str)]) -> Result<()> {
    tensors
        .iter()
        .try_for_each(|(t, what)| expect_dtype(t, candle_dtype(dtype), what))
}

/// The launch configuration of a shape chosen by `tessera_kernels::gpu::launch`.
fn config(shape: LaunchShape) -> LaunchConfig {
    LaunchConfig {
        grid_dim: shape.grid,
        block_dim: (shape.block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn i32_of(x: usize, what: &str) -> Result<i32> {
    i32::try_from(x)
        .map_err(|_| EngineError::Step(format!("{what} {x} does not fit a kernel argument")))
}

/// The candle dtype of a KV element type.
pub fn candle_dtype(d: KvDtype) -> DType {
    match d {
        KvDtype::Bf16 => DType::BF16,
        KvDtype::F16 => DType::F16,
    }
}

/// RoPE tables on the device: `cos` and `sin`, f32 `[max_positions, head_dim / 2]`.
#[derive(Debug, Clone)]
pub struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
    pub interleaved: bool,
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
    dev: &CudaDevice,
    dtype: KvDtype,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &StepMeta,
    rope: &RopeTables,
    heads: HeadLayout,
) -> Result<()> {
    with_element!(dtype, T => {
        expect_all(
            dtype,
            &[(qkv, "qkv"), (k_cache, "K cache"), (v_cache, "V cache")],
        )?;
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
        let (qkv_h, k_h, v_h) = (
            Held::new(qkv, "qkv")?,
            Held::new(k_cache, "K cache")?,
            Held::new(v_cache, "V cache")?,
        );
        let (cos_h, sin_h) = (
            Held::new(&rope.cos, "rope cos")?,
            Held::new(&rope.sin, "rope sin")?,
        );
        let (qkv_v, k_v, v_v) = (qkv_h.view::<T>()?, k_h.view::<T>()?, v_h.view::<T>()?);
        let (cos_v, sin_v) = (cos_h.view::<f32>()?, sin_h.view::<f32>()?);
        let meta_h = meta.held()?;
        let positions = meta.positions(&meta_h)?;
        let slots = meta.slots(&meta_h)?;
        let name = rope_write_kernel(dtype);
        let f = func!(dev, "tessera_kv_write", ptx::KV_WRITE, &name)?;
        let stride = i32_of(width, "qkv width")?;
        let nq = i32_of(heads.num_q_heads, "query heads")?;
        let nkv = i32_of(heads.num_kv_heads, "KV heads")?;
        let hd = i32_of(heads.head_dim, "head dim")?;
        let interleaved = i32::from(rope.interleaved);
        let mut b = f.builder();
        b.arg(&qkv_v)
            .arg(&stride)
            .arg(&k_v)
            .arg(&v_v)
            .arg(&positions)
            .arg(&slots);
        b.arg(&cos_v)
            .arg(&sin_v)
            .arg(&nq)
            .arg(&nkv)
            .arg(&hd)
            .arg(&interleaved);
        let cfg = config(rope_write_shape(
            n,
            heads.num_q_heads,
            heads.num_kv_heads,
            heads.head_dim,
        ));
        // SAFETY: the arguments match the kernel's signature in kv_write.cu; every index the
        // kernel forms is within the buffers: token rows < n, slots < the cache's slots
        // (checked by `Batch::from_plan`), positions < the RoPE table (likewise).
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
        Ok(())
    })
}

/// What a layer's attention reads and how it scales scores.
#[derive(Debug, Clone, Copy)]
pub struct LayerAttention {
    /// A sliding-window layer attends to its last `window` positions only.
    pub window: Option<usize>,
    /// Scores are `q · k · scale` (1/√head_dim unless the model says otherwise).
    pub scale: f32,
}

/// Attention of every token of the step over its sequence's cached context, or over its
/// last positions for a sliding-window layer. `qkv` holds the rotated queries (its first
/// `num_q_heads * head_dim` columns); returns `[tokens, num_q_heads * head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    dev: &CudaDevice,
    dtype: KvDtype,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &StepMeta,
    heads: HeadLayout,
    layer: LayerAttention,
) -> Result<Tensor> {
    with_element!(dtype, T => {
        expect_all(
            dtype,
            &[(qkv, "qkv"), (k_cache, "K cache"), (v_cache, "V cache")],
        )?;
        let n = meta.num_tokens;
        let (hd, nq) = (heads.head_dim, heads.num_q_heads);
        let out_width = nq * hd;
        // SAFETY: every row of the output is written: each token is in exactly one tile.
        let out: CudaSlice<T> =
            unsafe { dev.alloc::<T>(n * out_width) }.map_err(|e| launch_err("alloc", e))?;
        if n == 0 {
            return Ok(wrap(out, dev, (0, out_width)));
        }
        let held = [
            Held::new(qkv, "qkv")?,
            Held::new(k_cache, "K cache")?,
            Held::new(v_cache, "V cache")?,
        ];
        let q_v = held[0].view::<T>()?;
        let k_v = held[1].view::<T>()?;
        let v_v = held[2].view::<T>()?;
        let meta_h = meta.held()?;
        let args = AttentionArgs {
            positions: meta.positions(&meta_h)?,
            seq_of_token: meta.seq_of_token(&meta_h)?,
            block_tables: meta.block_tables(&meta_h)?,
            kv_of_q: meta.kv_of_q(&meta_h)?,
            max_blocks: i32_of(meta.max_blocks, "blocks per sequence")?,
            q_stride: i32_of(heads.qkv_width(), "qkv width")?,
            out_stride: i32_of(out_width, "output width")?,
            nq: i32_of(nq, "query heads")?,
            nkv: i32_of(heads.num_kv_heads, "KV heads")?,
            block_size: i32_of(meta.block_size, "block size")?,
            scale: layer.scale,
            // 0: the whole context.
            window: i32_of(layer.window.unwrap_or(0), "attention window")?,
        };
        // A sliding layer's decode partitions split its window, not the whole context.
        let decode = match layer.window {
            Some(w) => std::borrow::Cow::Owned(meta.plan.decode.decode_windowed(w)),
            None => std::borrow::Cow::Borrowed(&meta.plan.decode),
        };
        for (launch, tile, tiles) in [
            (decode.as_ref(), 1, meta.decode_tiles(&meta_h)?),
            (
                &meta.plan.prefill,
                PREFILL_TILE,
                meta.prefill_tiles(&meta_h)?,
            ),
        ] {
            if launch.is_empty() {
                continue;
            }
            launch_tiles::<T>(
                dev, dtype, hd, tile, launch, &tiles, &q_v, &k_v, &v_v, &out, &args,
            )?;
        }
        Ok(wrap(out, dev, (n, out_width)))
    })
}

/// Arguments shared by the decode and prefill launches of one attention call.
struct AttentionArgs<'a> {
    positions: candle_core::cuda::cudarc::driver::CudaView<'a, u32>,
    seq_of_token: candle_core::cuda::cudarc::driver::CudaView<'a, u32>,
    block_tables: candle_core::cuda::cudarc::driver::CudaView<'a, u32>,
    kv_of_q: candle_core::cuda::cudarc::driver::CudaView<'a, u32>,
    max_blocks: i32,
    q_stride: i32,
    out_stride: i32,
    nq: i32,
    nkv: i32,
    block_size: i32,
    scale: f32,
    window: i32,
}

type View<'a, T> = candle_core::cuda::cudarc::driver::CudaView<'a, T>;

#[allow(clippy::too_many_arguments)]
fn launch_tiles<T: CudaDType + DeviceRepr>(
    dev: &CudaDevice,
    dtype: KvDtype,
    hd: usize,
    tile: usize,
    launch: &TileLaunch,
    tiles: &(View<'_, u32>, View<'_, u32>),
    q: &View<'_, T>,
    k: &View<'_, T>,
    v: &View<'_, T>,
    out: &CudaSlice<T>,
    a: &AttentionArgs<'_>,
) -> Result<()> {
    let num_tiles = launch.num_tiles();
    let parts = launch.partitions.max(1);
    let nq = a.nq as usize;
    // Partial results of split contexts; every partition writes its entries.
    let partials = if parts > 1 { num_tiles * nq * parts } else { 1 };
    // SAFETY: written by the attention kernel before the merge reads them; unused (one
    // element: the driver allocates no empty buffers) when the context is not split.
    let part_ms: CudaSlice<f32> =
        unsafe { dev.alloc::<f32>(partials * 2) }.map_err(|e| launch_err("alloc", e))?;
    let part_acc: CudaSlice<f32> =
        unsafe { dev.alloc::<f32>(partials * hd) }.map_err(|e| launch_err("alloc", e))?;
    let name = attention_kernel(dtype, hd, tile);
    let f = func!(dev, "tessera_attention", ptx::ATTENTION, &name)?;
    let partition_size = i32_of(launch.partition_size, "partition size")?;
    let mut b = f.builder();
    b.arg(out)
        .arg(&a.out_stride)
        .arg(&part_ms)
        .arg(&part_acc)
        .arg(q)
        .arg(&a.q_stride);
    b.arg(k)
        .arg(v)
        .arg(&a.positions)
        .arg(&tiles.0)
        .arg(&tiles.1)
        .arg(&a.seq_of_token);
    b.arg(&a.block_tables)
        .arg(&a.max_blocks)
        .arg(&a.kv_of_q)
        .arg(&a.nq)
        .arg(&a.nkv);
    b.arg(&a.block_size)
        .arg(&a.scale)
        .arg(&partition_size)
        .arg(&a.window);
    let cfg = config(attention_shape(nq, launch));
    // SAFETY: the arguments match attention.cu's signature; tiles, positions, block
    // tables and kv_of_q come from `StepMeta`, which checks them against the cache.
    unsafe { b.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
    if parts > 1 {
        let name = merge_kernel(dtype, hd);
        let f = func!(dev, "tessera_attention", ptx::ATTENTION, &name)?;
        let parts_i32 = i32_of(parts, "partitions")?;
        let mut b = f.builder();
        b.arg(out)
            .arg(&a.out_stride)
            .arg(&part_ms)
            .arg(&part_acc)
            .arg(&tiles.0);
        b.arg(&a.nq).arg(&parts_i32);
        let cfg = config(merge_shape(nq, launch, hd));
        // SAFETY: as above; the partial buffers hold `num_tiles * nq * parts` entries.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
    }
    Ok(())
}

/// act(gate) · up of a fused `[rows, 2 * width]` gate/up output: `[rows, width]`, with
/// the model's activation (SiLU, or GELU's tanh approximation).
pub fn gated_mul(
    dev: &CudaDevice,
    dtype: KvDtype,
    gate_up: &Tensor,
    width: usize,
    activation: Activation,
) -> Result<Tensor> {
    with_element!(dtype, T => {
        expect_all(dtype, &[(gate_up, "gate/up")])?;
        let (rows, cols) = gate_up.dims2()?;
        if cols != 2 * width {
            return Err(EngineError::Step(format!(
                "gate/up is {cols} wide, expected 2 x {width}"
            )));
        }
        let total = rows * width;
        // SAFETY: the kernel writes every one of the `total` elements.
        let out: CudaSlice<T> = unsafe { dev.alloc::<T>(total) }.map_err(|e| launch_err("alloc", e))?;
        if total == 0 {
            return Ok(wrap(out, dev, (rows, width)));
        }
        let held = Held::new(gate_up, "gate/up")?;
        let gu = held.view::<T>()?;
        let gate = match activation {
            Activation::Silu => Gate::Silu,
            Activation::GeluTanh => Gate::GeluTanh,
        };
        let name = gated_kernel(dtype, gate);
        let f = func!(dev, "tessera_activations", ptx::ACTIVATIONS, &name)?;
        let width_i32 = i32_of(width, "width")?;
        let mut b = f.builder();
        b.arg(&out).arg(&gu).arg(&width_i32).arg(&total);
        let cfg = config(gated_shape(total));
        // SAFETY: matches activations.cu; a grid-stride loop covers `total` elements.
        unsafe { b.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
        Ok(wrap(out, dev, (rows, width)))
    })
}

/// `x + delta` (f32, `[rows, cols]`; `x` alone when `delta` is `None`) and its RMSNorm
/// with weight `w` (f32, `[cols]`) in the matmul input type, in one kernel:
/// returns `(x + delta, norm)`.
pub fn add_rms_norm(
    dev: &CudaDevice,
    dtype: KvDtype,
    x: &Tensor,
    delta: Option<&Tensor>,
    w: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    with_element!(dtype, T => {
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
        // SAFETY: the kernel writes every element of both outputs.
        let x_out: CudaSlice<f32> =
            unsafe { dev.alloc::<f32>(rows * cols) }.map_err(|e| launch_err("alloc", e))?;
        let h: CudaSlice<T> =
            unsafe { dev.alloc::<T>(rows * cols) }.map_err(|e| launch_err("alloc", e))?;
        if rows > 0 {
            let (xh, wh) = (Held::new(x, "residual")?, Held::new(w, "norm weight")?);
            let dh = delta.map(|d| Held::new(d, "residual delta")).transpose()?;
            let (xv, wv) = (xh.view::<f32>()?, wh.view::<f32>()?);
            let dv = dh.as_ref().map(|d| d.view::<f32>()).transpose()?;
            let name = norm_kernel(dtype);
            let f = func!(dev, "tessera_norm", ptx::NORM, &name)?;
            let cols_i32 = i32_of(cols, "hidden size")?;
            let null: u64 = 0;
            let mut b = f.builder();
            b.arg(&x_out).arg(&h).arg(&xv);
            match &dv {
                Some(d) => b.arg(d),
                // A null pointer: the kernel adds nothing.
                None => b.arg(&null),
            };
            b.arg(&wv).arg(&cols_i32).arg(&eps);
            let cfg = config(norm_shape(rows, cols));
            // SAFETY: matches norm.cu; every pointer covers rows x cols (w: cols) elements.
            unsafe { b.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
        }
        Ok((wrap(x_out, dev, (rows, cols)), wrap(h, dev, (rows, cols))))
    })
}

/// What the device reduced a step's logit rows to.
#[derive(Debug, Default)]
pub struct Reductions {
    /// Each row's arg-max column, the lowest index winning ties as in the host sampler;
    /// 0 for a row whose values are all NaN.
    pub argmax: Vec<u32>,
    /// With temperatures, each row's sampling candidates (`sampler::sampling_candidates`:
    /// token and logit, by token); `None` for a row the host must take whole.
    pub candidates: Vec<Option<CandidateRow>>,
}

/// The arg-max of each row of f32 `logits` (`[rows, cols]`) and, given a temperature per
/// row, the row's sampling candidates: two kernels, then copies of a few bytes per row
/// and of at most [`MAX_CANDIDATES`] pairs per candidate row.
pub fn reduce_rows(
    dev: &CudaDevice,
    logits: &Tensor,
    temperatures: Option<&[f32]>,
) -> Result<Reductions> {
    expect_dtype(logits, DType::F32, "logits")?;
    let (rows, cols) = logits.dims2()?;
    if rows == 0 || cols == 0 {
        return Ok(Reductions {
            argmax: vec![0; rows],
            candidates: vec![None; rows],
        });
    }
    let cols_i32 = i32_of(cols, "vocabulary size")?;
    let (shape, per_block) = argmax_shape(rows, cols);
    let per_block_i32 = i32_of(per_block, "columns per block")?;
    let stream = dev.cuda_stream();
    let keys: CudaSlice<u64> = stream
        .alloc_zeros::<u64>(rows)
        .map_err(|e| launch_err("alloc", e))?;
    let held = Held::new(logits, "logits")?;
    let lv = held.view::<f32>()?;
    let name = ARGMAX_KERNEL;
    let f = func!(dev, "tessera_argmax", ptx::ARGMAX, name)?;
    let mut b = f.builder();
    b.arg(&keys).arg(&lv).arg(&cols_i32).arg(&per_block_i32);
    // SAFETY: matches argmax.cu; `keys` holds one zeroed key per row and every block reads
    // columns below `cols` of its own row.
    unsafe { b.launch(config(shape)) }.map_err(|e| launch_err(name, e))?;
    let candidates = match temperatures {
        None => vec![None; rows],
        Some(t) => {
            if t.len() != rows {
                return Err(EngineError::Step(format!(
                    "{} temperatures for {rows} rows",
                    t.len()
                )));
            }
            let temps = stream
                .clone_htod(t)
                .map_err(|e| launch_err("copy to device", e))?;
            let cap = MAX_CANDIDATES;
            let cap_i32 = i32_of(cap, "candidates per row")?;
            let counts: CudaSlice<u32> = stream
                .alloc_zeros::<u32>(rows)
                .map_err(|e| launch_err("alloc", e))?;
            // SAFETY: the kernel writes the slots it counts, below `cap`; the host reads
            // only those (`candidate_rows`).
            let ids: CudaSlice<u32> =
                unsafe { dev.alloc::<u32>(rows * cap) }.map_err(|e| launch_err("alloc", e))?;
            // SAFETY: as above.
            let values: CudaSlice<f32> =
                unsafe { dev.alloc::<f32>(rows * cap) }.map_err(|e| launch_err("alloc", e))?;
            let name = CANDIDATES_KERNEL;
            let f = func!(dev, "tessera_candidates", ptx::CANDIDATES, name)?;
            let mut b = f.builder();
            b.arg(&counts).arg(&ids).arg(&values).arg(&keys).arg(&lv);
            b.arg(&temps)
                .arg(&cols_i32)
                .arg(&per_block_i32)
                .arg(&cap_i32);
            // SAFETY: matches candidates.cu, launched on the arg-max's grid: one key,
            // count and temperature per row, `cap` slots per row.
            unsafe { b.launch(config(shape)) }.map_err(|e| launch_err(name, e))?;
            let counts = stream
                .clone_dtoh(&counts)
                .map_err(|e| launch_err("copy to host", e))?;
            // Only the slots the fullest row used come back (slot-major: one prefix).
            let used = candidate_slots_used(&counts, cap);
            let (ids, values) = if used == 0 {
                (Vec::new(), Vec::new())
            } else {
                (
                    stream
                        .clone_dtoh(&ids.slice(..used * rows))
                        .map_err(|e| launch_err("copy to host", e))?,
                    stream
                        .clone_dtoh(&values.slice(..used * rows))
                        .map_err(|e| launch_err("copy to host", e))?,
                )
            };
            candidate_rows(&counts, &ids, &values, cap)
        }
    };
    let keys = stream
        .clone_dtoh(&keys)
        .map_err(|e| launch_err("copy to host", e))?;
    let argmax = keys.into_iter().map(column_of_key).collect();
    Ok(Reductions { argmax, candidates })
}

/// The arg-max column of each row of f32 `logits` (`[rows, cols]`), the lowest index
/// winning ties as in the host sampler; rows whose values are all NaN give 0.
pub fn argmax_rows(dev: &CudaDevice, logits: &Tensor) -> Result<Vec<u32>> {
    Ok(reduce_rows(dev, logits, None)?.argmax)
}
