//! Tessera's CUDA kernels (`kernels/cuda/*.cu`) run on the CPU.
//!
//! The build script compiles the `.cu` sources as host C++ against headers that stand in
//! for CUDA (`include/cuda_emulation.h`): every CUDA thread of a block is a fiber,
//! `__syncthreads` and warp shuffles are real barriers, blocks run one after another. The
//! functions here launch a kernel by the name the engine uses, on the shape the engine
//! chooses (`tessera_kernels::gpu::launch`), over host buffers. So the kernels' indexing,
//! masking, tiling and reductions are tested on every machine, and a GPU run checks
//! what only a GPU can tell (compilation for the device, speed, the device's math).

pub mod quant_matvec;

use std::ffi::{c_char, c_int, c_void, CString};

use half::{bf16, f16};
use tessera_kernels::gpu::launch::{
    argmax_shape, attention_kernel, attention_shape, candidate_rows, candidate_slots_used,
    clamped_gate_kernel, column_of_key, gated_kernel, gated_shape, log_sum_exp_rows, merge_kernel,
    merge_shape, norm_kernel, norm_shape, rope_write_kernel, rope_write_shape, AttentionPlan,
    CandidateRow, Gate, KernelArg, KvDtype, LaunchShape, TileLaunch, ARGMAX_KERNEL,
    CANDIDATES_KERNEL, EXP_SUMS_KERNEL, PREFILL_TILE,
};

/// What can go wrong launching an emulated kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmuError {
    /// The sources define no kernel of that name.
    UnknownKernel(String),
    /// A buffer is smaller than the launch reads or writes.
    Size(String),
    /// The arguments do not match the kernel's signature.
    Arguments(String),
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmuError::UnknownKernel(name) => write!(f, "no kernel named {name}"),
            EmuError::Size(what) => write!(f, "buffer too small: {what}"),
            EmuError::Arguments(what) => write!(f, "kernel arguments: {what}"),
        }
    }
}

impl std::error::Error for EmuError {}

pub type Result<T> = std::result::Result<T, EmuError>;

/// A 16-bit element type of the kernels.
pub trait Element: Copy + Default + Send + Sync + 'static {
    const DTYPE: KvDtype;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Element for bf16 {
    const DTYPE: KvDtype = KvDtype::Bf16;
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl Element for f16 {
    const DTYPE: KvDtype = KvDtype::F16;
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

#[repr(C)]
struct EmuGrid {
    grid: [u32; 3],
    block: [u32; 3],
}

impl From<LaunchShape> for EmuGrid {
    fn from(s: LaunchShape) -> Self {
        EmuGrid {
            grid: [s.grid.0, s.grid.1, s.grid.2],
            block: [s.block, 1, 1],
        }
    }
}

extern "C" {
    fn tessera_emu_launch(
        name: *const c_char,
        g: *const EmuGrid,
        params: *mut *mut c_void,
        sizes: *const usize,
        count: c_int,
    ) -> c_int;
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| EmuError::UnknownKernel(name.to_string()))
}

/// Launches kernel `name` on `shape` with `args`, as the CUDA launcher would: every
/// pointer argument is a host address here. The argument count and each width must match
/// the kernel's signature.
///
/// # Safety
///
/// Every pointer argument must address a live host buffer as large as the kernel reads
/// or writes at that position, with nothing else reading or writing what it writes
/// during the launch.
pub unsafe fn launch(name: &str, shape: LaunchShape, args: &[KernelArg]) -> Result<()> {
    let c = c_name(name)?;
    let grid = EmuGrid::from(shape);
    let mut params: Vec<*mut c_void> = args.iter().map(KernelArg::as_param).collect();
    let sizes: Vec<usize> = args.iter().map(KernelArg::size).collect();
    let count = int(args.len(), "argument count")?;
    // SAFETY: `params` and `sizes` hold `count` entries; each param points at a value
    // in `args`, borrowed for the call; the buffers are the caller's promise.
    let rc = unsafe {
        tessera_emu_launch(
            c.as_ptr(),
            &grid,
            params.as_mut_ptr(),
            sizes.as_ptr(),
            count,
        )
    };
    match rc {
        0 => Ok(()),
        -1 => Err(EmuError::UnknownKernel(name.to_string())),
        -2 => Err(EmuError::Arguments(format!(
            "{name} does not take {} arguments",
            args.len()
        ))),
        _ => Err(EmuError::Arguments(format!(
            "an argument of {name} has the wrong width: {args:?}"
        ))),
    }
}

/// A host buffer's address as a kernel argument.
fn ptr<T>(p: *const T) -> KernelArg {
    KernelArg::Ptr(p as u64)
}

fn int(x: usize, what: &str) -> Result<c_int> {
    c_int::try_from(x).map_err(|_| EmuError::Size(format!("{what} {x} exceeds an int")))
}

fn arg_int(x: usize, what: &str) -> Result<KernelArg> {
    int(x, what).map(KernelArg::I32)
}

fn at_least(len: usize, need: usize, what: &str) -> Result<()> {
    if len < need {
        return Err(EmuError::Size(format!("{what}: {len} < {need}")));
    }
    Ok(())
}

/// A rank's attention geometry.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    /// Width of a fused QKV row.
    pub fn qkv_width(&self) -> usize {
        (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
    }
}

/// A step's metadata as the kernels read it (the engine packs it in `PackedMeta`).
#[derive(Debug, Clone, Copy)]
pub struct StepTables<'a> {
    pub positions: &'a [u32],
    pub slots: &'a [u32],
    pub seq_of_token: &'a [u32],
    /// One row of `max_blocks` entries per sequence.
    pub block_tables: &'a [u32],
    pub max_blocks: usize,
    pub kv_of_q: &'a [u32],
    pub block_size: usize,
    pub plan: &'a AttentionPlan,
}

impl StepTables<'_> {
    fn num_tokens(&self) -> usize {
        self.positions.len()
    }

    /// Every index the kernels form from the tables stays inside `slots_in_cache`.
    fn check(&self, slots_in_cache: usize, heads: Heads) -> Result<()> {
        let n = self.num_tokens();
        at_least(self.slots.len(), n, "slots")?;
        at_least(self.seq_of_token.len(), n, "sequence of each token")?;
        at_least(
            self.kv_of_q.len(),
            heads.num_q_heads,
            "KV head of each query head",
        )?;
        let seqs = self.block_tables.len() / self.max_blocks.max(1);
        if let Some(s) = self.seq_of_token.iter().find(|s| **s as usize >= seqs) {
            return Err(EmuError::Size(format!("sequence {s} has no block table")));
        }
        let blocks = slots_in_cache / self.block_size.max(1);
        if let Some(b) = self.block_tables.iter().find(|b| **b as usize >= blocks) {
            return Err(EmuError::Size(format!("block {b} is not in the cache")));
        }
        if let Some(s) = self.slots.iter().find(|s| **s as usize >= slots_in_cache) {
            return Err(EmuError::Size(format!("slot {s} is not in the cache")));
        }
        for t in 0..n {
            let seq = self.seq_of_token[t] as usize;
            let pos = self.positions[t] as usize;
            if pos / self.block_size >= self.max_blocks
                || self.block_tables[seq * self.max_blocks + pos / self.block_size] as usize
                    * self.block_size
                    + pos % self.block_size
                    != self.slots[t] as usize
            {
                return Err(EmuError::Size(format!(
                    "token {t}'s slot is not its block table's"
                )));
            }
        }
        Ok(())
    }
}

/// How the RoPE tables of [`rope_write_kv`] pair a head's dimensions.
#[derive(Debug, Clone, Copy)]
pub struct RopePairs {
    /// `(2i, 2i + 1)`, else `(i, i + rotary_half)`.
    pub interleaved: bool,
    /// Rotation pairs of the rotated part of a head (`head_dim / 2` unless partial).
    pub rotary_half: usize,
}

/// RoPE on the queries (in place) and keys of `qkv`, keys and values into their cache
/// slots; `cos`/`sin` are `[positions, head_dim / 2]`.
#[allow(clippy::too_many_arguments)]
pub fn rope_write_kv<T: Element>(
    qkv: &mut [T],
    k_cache: &mut [T],
    v_cache: &mut [T],
    meta: &StepTables<'_>,
    cos: &[f32],
    sin: &[f32],
    pairs: RopePairs,
    heads: Heads,
) -> Result<()> {
    let n = meta.num_tokens();
    let width = heads.qkv_width();
    let row = heads.num_kv_heads * heads.head_dim;
    at_least(qkv.len(), n * width, "qkv")?;
    at_least(v_cache.len(), k_cache.len(), "V cache")?;
    meta.check(k_cache.len() / row, heads)?;
    let half = heads.head_dim / 2;
    if pairs.rotary_half == 0 || pairs.rotary_half > half {
        return Err(EmuError::Size(format!(
            "{} rotation pairs in a head of {}",
            pairs.rotary_half, heads.head_dim
        )));
    }
    let max_pos = meta.positions.iter().max().map_or(0, |p| *p as usize + 1);
    at_least(cos.len().min(sin.len()), max_pos * half, "RoPE tables")?;
    if n == 0 {
        return Ok(());
    }
    let name = rope_write_kernel(T::DTYPE);
    let shape = rope_write_shape(n, heads.num_q_heads, heads.num_kv_heads, heads.head_dim);
    let args = [
        ptr(qkv.as_mut_ptr()),
        arg_int(width, "qkv width")?,
        ptr(k_cache.as_mut_ptr()),
        ptr(v_cache.as_mut_ptr()),
        ptr(meta.positions.as_ptr()),
        ptr(meta.slots.as_ptr()),
        ptr(cos.as_ptr()),
        ptr(sin.as_ptr()),
        arg_int(heads.num_q_heads, "query heads")?,
        arg_int(heads.num_kv_heads, "KV heads")?,
        arg_int(heads.head_dim, "head dim")?,
        KernelArg::I32(i32::from(pairs.interleaved)),
        arg_int(pairs.rotary_half, "rotation pairs")?,
    ];
    // SAFETY: the buffers cover every index the kernel forms (checked above).
    unsafe { launch(&name, shape, &args) }
}

/// How one attention call scores keys: `q · k · scale`, capped to `softcap · tanh(s /
/// softcap)` where set, over the last `window` positions where set; with `sinks`, one
/// logit per query head joins its softmax (gpt-oss).
#[derive(Debug, Clone, Copy)]
pub struct Scores<'a> {
    pub scale: f32,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
    pub sinks: Option<&'a [f32]>,
}

/// Paged attention of every token of the step over its cached context (or its last
/// `window` positions): `[tokens, num_q_heads * head_dim]`. `qkv` holds the rotated
/// queries in its first columns.
pub fn paged_attention<T: Element>(
    qkv: &[T],
    k_cache: &[T],
    v_cache: &[T],
    meta: &StepTables<'_>,
    heads: Heads,
    scores: Scores<'_>,
) -> Result<Vec<T>> {
    let window = scores.window;
    if let Some(s) = scores.sinks {
        at_least(s.len(), heads.num_q_heads, "sinks")?;
    }
    let n = meta.num_tokens();
    let (nq, hd) = (heads.num_q_heads, heads.head_dim);
    at_least(qkv.len(), n * heads.qkv_width(), "qkv")?;
    at_least(v_cache.len(), k_cache.len(), "V cache")?;
    meta.check(k_cache.len() / (heads.num_kv_heads * hd), heads)?;
    let mut out = vec![T::default(); n * nq * hd];
    let plan = meta.plan;
    // As the engine launches it: a sliding layer's decode partitions split its window.
    let decode = match window {
        Some(w) => std::borrow::Cow::Owned(plan.decode.decode_windowed(w)),
        None => std::borrow::Cow::Borrowed(&plan.decode),
    };
    for (launch, tile) in [(decode.as_ref(), 1), (&plan.prefill, PREFILL_TILE)] {
        if launch.is_empty() {
            continue;
        }
        attention_launch(
            qkv, k_cache, v_cache, meta, heads, scores, launch, tile, &mut out,
        )?;
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn attention_launch<T: Element>(
    qkv: &[T],
    k_cache: &[T],
    v_cache: &[T],
    meta: &StepTables<'_>,
    heads: Heads,
    scores: Scores<'_>,
    launch: &TileLaunch,
    tile: usize,
    out: &mut [T],
) -> Result<()> {
    let (nq, hd) = (heads.num_q_heads, heads.head_dim);
    let n = meta.num_tokens();
    for (s, l) in launch.start.iter().zip(&launch.len) {
        if (*s + *l) as usize > n || *l as usize > tile {
            return Err(EmuError::Size(format!("tile {s}+{l} of {n} tokens")));
        }
    }
    let parts = launch.partitions.max(1);
    let partials = launch.num_tiles() * nq * parts;
    let mut part_ms = vec![f32::NAN; partials * 2];
    let mut part_acc = vec![f32::NAN; partials * hd];
    let name = attention_kernel(T::DTYPE, hd, tile);
    let out_stride = arg_int(nq * hd, "output width")?;
    let nq_arg = arg_int(nq, "query heads")?;
    let args = [
        ptr(out.as_mut_ptr()),
        out_stride,
        ptr(part_ms.as_mut_ptr()),
        ptr(part_acc.as_mut_ptr()),
        ptr(qkv.as_ptr()),
        arg_int(heads.qkv_width(), "qkv width")?,
        ptr(k_cache.as_ptr()),
        ptr(v_cache.as_ptr()),
        ptr(meta.positions.as_ptr()),
        ptr(launch.start.as_ptr()),
        ptr(launch.len.as_ptr()),
        ptr(meta.seq_of_token.as_ptr()),
        ptr(meta.block_tables.as_ptr()),
        arg_int(meta.max_blocks, "blocks per sequence")?,
        ptr(meta.kv_of_q.as_ptr()),
        nq_arg,
        arg_int(heads.num_kv_heads, "KV heads")?,
        arg_int(meta.block_size, "block size")?,
        KernelArg::F32(scores.scale),
        arg_int(launch.partition_size, "partition size")?,
        arg_int(scores.window.unwrap_or(0), "window")?,
        // 0: no cap.
        KernelArg::F32(scores.softcap.unwrap_or(0.0)),
        // Null: no sinks.
        ptr(scores.sinks.map_or(std::ptr::null(), <[f32]>::as_ptr)),
    ];
    // SAFETY: the tables were checked against the cache, the tiles against the tokens;
    // the partial buffers hold every (tile, head, partition).
    unsafe { self::launch(&name, attention_shape(nq, launch), &args) }?;
    if parts > 1 {
        let name = merge_kernel(T::DTYPE, hd);
        let args = [
            ptr(out.as_mut_ptr()),
            out_stride,
            ptr(part_ms.as_ptr()),
            ptr(part_acc.as_ptr()),
            ptr(launch.start.as_ptr()),
            nq_arg,
            arg_int(parts, "partitions")?,
            ptr(scores.sinks.map_or(std::ptr::null(), <[f32]>::as_ptr)),
        ];
        // SAFETY: as above.
        unsafe { self::launch(&name, merge_shape(nq, launch, hd), &args) }?;
    }
    Ok(())
}

/// act(gate) · up of fused `[rows, 2 * width]` gate/up rows.
pub fn gated_mul<T: Element>(gate_up: &[T], width: usize, gate: Gate) -> Result<Vec<T>> {
    let rows = gate_up.len() / (2 * width).max(1);
    let total = rows * width;
    let mut out = vec![T::default(); total];
    if total == 0 {
        return Ok(out);
    }
    let name = gated_kernel(T::DTYPE, gate);
    let args = [
        ptr(out.as_mut_ptr()),
        ptr(gate_up.as_ptr()),
        arg_int(width, "width")?,
        KernelArg::Usize(total),
    ];
    // SAFETY: `gate_up` holds `rows` rows of 2 · width; `out` holds `total`.
    unsafe { launch(&name, gated_shape(total), &args) }?;
    Ok(out)
}

/// gpt-oss's clamped gate of fused `[rows, 2 * width]` gate/up rows.
pub fn clamped_swiglu_mul<T: Element>(
    gate_up: &[T],
    width: usize,
    alpha: f32,
    limit: f32,
) -> Result<Vec<T>> {
    let rows = gate_up.len() / (2 * width).max(1);
    let total = rows * width;
    let mut out = vec![T::default(); total];
    if total == 0 {
        return Ok(out);
    }
    let args = [
        ptr(out.as_mut_ptr()),
        ptr(gate_up.as_ptr()),
        arg_int(width, "width")?,
        KernelArg::Usize(total),
        KernelArg::F32(alpha),
        KernelArg::F32(limit),
    ];
    // SAFETY: `gate_up` holds `rows` rows of 2 · width; `out` holds `total`.
    unsafe { launch(&clamped_gate_kernel(T::DTYPE), gated_shape(total), &args) }?;
    Ok(out)
}

/// `(x + delta, RMSNorm(x + delta) · w)` of `[rows, cols]` f32 rows.
pub fn add_rms_norm<T: Element>(
    x: &[f32],
    delta: Option<&[f32]>,
    w: &[f32],
    eps: f32,
) -> Result<(Vec<f32>, Vec<T>)> {
    let cols = w.len();
    let rows = x.len() / cols.max(1);
    if let Some(d) = delta {
        at_least(d.len(), x.len(), "delta")?;
    }
    let mut x_out = vec![0f32; rows * cols];
    let mut h = vec![T::default(); rows * cols];
    if rows == 0 {
        return Ok((x_out, h));
    }
    let name = norm_kernel(T::DTYPE);
    let args = [
        ptr(x_out.as_mut_ptr()),
        ptr(h.as_mut_ptr()),
        ptr(x.as_ptr()),
        ptr(delta.map_or(std::ptr::null(), |d| d.as_ptr())),
        ptr(w.as_ptr()),
        arg_int(cols, "columns")?,
        KernelArg::F32(eps),
    ];
    // SAFETY: every pointer covers rows × cols values (`w`: cols); null delta adds nothing.
    unsafe { launch(&name, norm_shape(rows, cols), &args) }?;
    Ok((x_out, h))
}

/// The arg-max kernel's key of each `cols`-wide row of `logits`.
fn argmax_keys(logits: &[f32], cols: usize) -> Result<Vec<u64>> {
    let rows = logits.len() / cols.max(1);
    let mut keys = vec![0u64; rows];
    if rows == 0 || cols == 0 {
        return Ok(keys);
    }
    let (shape, per_block) = argmax_shape(rows, cols);
    let args = [
        ptr(keys.as_mut_ptr()),
        ptr(logits.as_ptr()),
        arg_int(cols, "columns")?,
        arg_int(per_block, "columns per block")?,
    ];
    // SAFETY: every block reads columns below `cols` of its own row; one key per row.
    unsafe { launch(ARGMAX_KERNEL, shape, &args) }?;
    Ok(keys)
}

/// The arg-max column of each `cols`-wide row of `logits`, lowest index on ties.
pub fn argmax_rows(logits: &[f32], cols: usize) -> Result<Vec<u32>> {
    Ok(argmax_keys(logits, cols)?
        .into_iter()
        .map(column_of_key)
        .collect())
}

/// Each row's log-sum-exp as the engine computes it on a GPU (arg-max keys, then each
/// block's sum of `exp(logit - best)`, added on the host in block order); NaN for a row
/// with no finite best.
pub fn row_log_sum_exp(logits: &[f32], cols: usize) -> Result<Vec<f32>> {
    let rows = logits.len() / cols.max(1);
    let keys = argmax_keys(logits, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(vec![f32::NAN; rows]);
    }
    let (shape, per_block) = argmax_shape(rows, cols);
    let blocks = shape.grid.0 as usize;
    let mut partials = vec![0f32; rows * blocks];
    let args = [
        ptr(partials.as_mut_ptr()),
        ptr(keys.as_ptr()),
        ptr(logits.as_ptr()),
        arg_int(cols, "columns")?,
        arg_int(per_block, "columns per block")?,
    ];
    // SAFETY: one key per row, one partial per block of each row; every block reads
    // columns below `cols` of its own row.
    unsafe { launch(EXP_SUMS_KERNEL, shape, &args) }?;
    Ok(log_sum_exp_rows(&partials, blocks, &keys))
}

/// Each row's sampling candidates at its temperature, as the engine launches the
/// kernels on a GPU (arg-max keys, then the candidates, at most `cap` a row).
pub fn sampling_candidates(
    logits: &[f32],
    cols: usize,
    temperatures: &[f32],
    cap: usize,
) -> Result<Vec<Option<CandidateRow>>> {
    let rows = logits.len() / cols.max(1);
    at_least(temperatures.len(), rows, "temperatures")?;
    let keys = argmax_keys(logits, cols)?;
    let (mut counts, mut ids, mut values) = (
        vec![0u32; rows],
        vec![0u32; rows * cap],
        vec![0f32; rows * cap],
    );
    if rows > 0 && cols > 0 {
        let (shape, per_block) = argmax_shape(rows, cols);
        let args = [
            ptr(counts.as_mut_ptr()),
            ptr(ids.as_mut_ptr()),
            ptr(values.as_mut_ptr()),
            ptr(keys.as_ptr()),
            ptr(logits.as_ptr()),
            ptr(temperatures.as_ptr()),
            arg_int(cols, "columns")?,
            arg_int(per_block, "columns per block")?,
            arg_int(cap, "candidates per row")?,
        ];
        // SAFETY: one key, count and temperature per row, `cap` slots per row.
        unsafe { launch(CANDIDATES_KERNEL, shape, &args) }?;
    }
    // As the engine copies them: the slots the fullest row used.
    let used = candidate_slots_used(&counts, cap);
    Ok(candidate_rows(
        &counts,
        &ids[..used * rows],
        &values[..used * rows],
        cap,
    ))
}
