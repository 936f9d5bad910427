//! Launch parameters of the CUDA attention kernels, chosen on the host.
//!
//! Pure Rust with no CUDA dependency, so every choice is tested on CPU. The kernels
//! (`cuda/attention.cu`) serve one query head and one *tile* of consecutive tokens of one
//! sequence per thread block: tiles of one token (decoding sequences) and tiles of up to
//! [`PREFILL_TILE`] tokens (prefill chunks, which then load each key once for the whole
//! tile). When decoding tiles alone would leave the GPU's multiprocessors idle, their
//! contexts are split into partitions whose partial softmaxes are merged after.

use std::ops::Range;

/// Threads per attention thread block, and keys per chunk (one key per thread).
pub const ATTENTION_THREADS: u32 = 128;
pub const ATTENTION_CHUNK: usize = 128;
/// Tokens of one sequence per prefill tile.
pub const PREFILL_TILE: usize = 16;
/// Head dimensions the kernels are compiled for.
pub const HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];
/// Most partitions a decoding token's context is split into.
pub const MAX_PARTITIONS: usize = 32;

/// Element type of the KV cache and of the activations the kernels read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    Bf16,
    F16,
}

impl KvDtype {
    pub fn suffix(self) -> &'static str {
        match self {
            KvDtype::Bf16 => "bf16",
            KvDtype::F16 => "f16",
        }
    }
}

/// Refuses a head dimension the kernels were not compiled for.
pub fn check_head_dim(head_dim: usize) -> Result<(), String> {
    if HEAD_DIMS.contains(&head_dim) {
        Ok(())
    } else {
        Err(format!(
            "head dimension {head_dim} has no CUDA attention kernel (supported: {HEAD_DIMS:?})"
        ))
    }
}

/// Name of the attention kernel for tiles of `tile` tokens (1 or [`PREFILL_TILE`]).
pub fn attention_kernel(dtype: KvDtype, head_dim: usize, tile: usize) -> String {
    format!("paged_attention_{}_hd{head_dim}_q{tile}", dtype.suffix())
}

/// Name of the kernel that merges the partitions of decoding tokens.
pub fn merge_kernel(dtype: KvDtype, head_dim: usize) -> String {
    format!("attention_merge_{}_hd{head_dim}", dtype.suffix())
}

/// A launch's grid (blocks in x, y, z) and threads per block (x only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    pub grid: (u32, u32, u32),
    pub block: u32,
}

/// One argument of a kernel launch, by value: a device address, or a scalar of the
/// kernel parameter's exact width. The CUDA launcher and the emulated one (which checks
/// each width against the kernel's signature) take the same list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// A buffer's address (a device pointer on CUDA; 0 for a null pointer).
    Ptr(u64),
    I32(i32),
    F32(f32),
    /// A `size_t`.
    Usize(usize),
}

impl KernelArg {
    /// The parameter's size in bytes.
    pub fn size(&self) -> usize {
        match self {
            KernelArg::Ptr(_) => std::mem::size_of::<u64>(),
            KernelArg::I32(_) => std::mem::size_of::<i32>(),
            KernelArg::F32(_) => std::mem::size_of::<f32>(),
            KernelArg::Usize(_) => std::mem::size_of::<usize>(),
        }
    }

    /// The address of the value, as `cuLaunchKernel` takes each parameter; valid while
    /// `self` is borrowed.
    pub fn as_param(&self) -> *mut std::ffi::c_void {
        match self {
            KernelArg::Ptr(v) => v as *const u64 as *mut std::ffi::c_void,
            KernelArg::I32(v) => v as *const i32 as *mut std::ffi::c_void,
            KernelArg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
            KernelArg::Usize(v) => v as *const usize as *mut std::ffi::c_void,
        }
    }
}

/// Threads of a `rope_write_kv` block.
pub const ROPE_WRITE_THREADS: u32 = 128;

/// `rope_write_kv_{dtype}`.
pub fn rope_write_kernel(dtype: KvDtype) -> String {
    format!("rope_write_kv_{}", dtype.suffix())
}

/// One block row per token, one thread per rotated (head, pair) and per value element.
pub fn rope_write_shape(
    tokens: usize,
    num_q_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> LaunchShape {
    let items = ((num_q_heads + num_kv_heads) * head_dim / 2).max(num_kv_heads * head_dim);
    LaunchShape {
        grid: (
            tokens as u32,
            items.div_ceil(ROPE_WRITE_THREADS as usize) as u32,
            1,
        ),
        block: ROPE_WRITE_THREADS,
    }
}

/// The activation of a gated MLP kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// SiLU(gate) · up.
    Silu,
    /// GELU(gate) · up, GELU's tanh approximation.
    GeluTanh,
}

/// `silu_mul_{dtype}` or `gelu_tanh_mul_{dtype}`.
pub fn gated_kernel(dtype: KvDtype, gate: Gate) -> String {
    let act = match gate {
        Gate::Silu => "silu_mul",
        Gate::GeluTanh => "gelu_tanh_mul",
    };
    format!("{act}_{}", dtype.suffix())
}

/// `clamped_swiglu_mul_{dtype}`: gpt-oss's experts' gate, whose kernel also takes the
/// gate's `alpha` and the clamp's `limit` (after the gated kernels' arguments); it runs on
/// [`gated_shape`].
pub fn clamped_gate_kernel(dtype: KvDtype) -> String {
    format!("clamped_swiglu_mul_{}", dtype.suffix())
}

/// A grid-stride loop over `total` outputs: 256 threads a block, at most 65535 blocks.
pub fn gated_shape(total: usize) -> LaunchShape {
    LaunchShape {
        grid: (total.div_ceil(256).min(65_535) as u32, 1, 1),
        block: 256,
    }
}

/// Most threads of an `add_rms_norm` block (norm.cu's launch bound).
pub const NORM_MAX_THREADS: usize = 1024;

/// `add_rms_norm_{dtype}`.
pub fn norm_kernel(dtype: KvDtype) -> String {
    format!("add_rms_norm_{}", dtype.suffix())
}

/// One block per row, one float4 per thread where the row allows, in whole warps.
pub fn norm_shape(rows: usize, cols: usize) -> LaunchShape {
    let threads = (cols.div_ceil(4).div_ceil(32) * 32).clamp(32, NORM_MAX_THREADS);
    LaunchShape {
        grid: (rows as u32, 1, 1),
        block: threads as u32,
    }
}

/// The compute capability this build's kernels (and candle's) were compiled for, as
/// `CUDA_COMPUTE_CAP` names it (90: Hopper; 80: Ampere): the PTX runs on that generation
/// and later ones only.
pub fn kernels_compute_cap() -> u32 {
    env!("TESSERA_CUDA_COMPUTE_CAP").parse().unwrap_or(80)
}

/// Why a GPU of compute capability `major.minor` cannot run kernels built for
/// `built_for` (`CUDA_COMPUTE_CAP` digits, e.g. 90), if it cannot. Below 8.0 no build
/// can serve it: the kernels compute in bf16.
pub fn check_compute_capability(major: i32, minor: i32, built_for: u32) -> Result<(), String> {
    let have = u32::try_from(major * 10 + minor).unwrap_or(0);
    if have < 80 {
        return Err(format!(
            "compute capability {major}.{minor}: Tessera's CUDA kernels compute in bf16, which \
             needs 8.0 or later (Ampere, Ada, Hopper, Blackwell); serve on cpu ranks instead"
        ));
    }
    if have < built_for {
        return Err(format!(
            "compute capability {major}.{minor}: this build's kernels target {}.{} and later; \
             rebuild with CUDA_COMPUTE_CAP={have} (see the README, GPUs)",
            built_for / 10,
            built_for % 10
        ));
    }
    Ok(())
}

/// The arg-max kernel of f32 rows.
pub const ARGMAX_KERNEL: &str = "argmax_rows_f32";
/// Threads of an arg-max block (argmax.cu), and the most columns one block scans.
pub const ARGMAX_THREADS: u32 = 256;
pub const ARGMAX_COLS_PER_BLOCK: usize = 4096;

/// Blocks across each row and one block row per row; returns the shape and the columns
/// each block scans.
pub fn argmax_shape(rows: usize, cols: usize) -> (LaunchShape, usize) {
    let per_block = ARGMAX_COLS_PER_BLOCK.min(cols).max(1);
    let shape = LaunchShape {
        grid: (cols.div_ceil(per_block) as u32, rows as u32, 1),
        block: ARGMAX_THREADS,
    };
    (shape, per_block)
}

/// The kernel that gathers each row's sampling candidates; launched on the arg-max's
/// shape ([`argmax_shape`]) after it, whose keys give each row's best logit.
pub const CANDIDATES_KERNEL: &str = "sampling_candidates_f32";
/// Most candidates a row hands over; a row with more is copied whole.
pub const MAX_CANDIDATES: usize = 4096;
/// The kernel that sums each row's `exp(logit - best)` per block (candidates.cu), for the
/// log-sum-exp of a row reported by its candidates; launched on [`argmax_shape`] too.
pub const EXP_SUMS_KERNEL: &str = "row_exp_sums_f32";

/// Each row's log-sum-exp from the kernel's per-block partial sums (`blocks` a row, in
/// block order) and the row's arg-max key (its best logit); NaN where the kernel found no
/// finite best.
pub fn log_sum_exp_rows(partials: &[f32], blocks: usize, keys: &[u64]) -> Vec<f32> {
    keys.iter()
        .enumerate()
        .map(|(r, k)| {
            let sum: f32 = partials
                .get(r * blocks..(r + 1) * blocks)
                .map_or(f32::NAN, |p| p.iter().sum());
            value_of_key(*k) + sum.ln()
        })
        .collect()
}

/// The best logit an arg-max key holds (argmax.cu's `key_of`, inverted); NaN for a key
/// of 0 (nothing beat NaN).
pub fn value_of_key(key: u64) -> f32 {
    if key == 0 {
        return f32::NAN;
    }
    let ordered = (key >> 32) as u32;
    let bits = if ordered & 0x8000_0000 != 0 {
        ordered & 0x7fff_ffff
    } else {
        !ordered
    };
    f32::from_bits(bits)
}

/// The column an arg-max key names (argmax.cu: the low half is its complement); a key
/// of 0 (nothing beat NaN) names column 0.
pub fn column_of_key(key: u64) -> u32 {
    if key == 0 {
        0
    } else {
        !(key as u32)
    }
}

/// Slots per row the candidates kernel filled in the fullest row (at most `cap`): the
/// prefix of its slot-major output that comes back to the host.
pub fn candidate_slots_used(counts: &[u32], cap: usize) -> usize {
    counts
        .iter()
        .map(|c| (*c as usize).min(cap))
        .max()
        .unwrap_or(0)
}

/// One row's sampling candidates: `(token, logit)` by token.
pub type CandidateRow = Vec<(u32, f32)>;

/// Each row's candidates as the kernel left them (`counts` per row; `ids` and `values`
/// slot-major, slot `s` of row `r` at `s * rows + r`, the first slots of every row),
/// sorted by column: `None` where the row must be copied whole (no finite best, or more
/// candidates than `cap`).
pub fn candidate_rows(
    counts: &[u32],
    ids: &[u32],
    values: &[f32],
    cap: usize,
) -> Vec<Option<CandidateRow>> {
    counts
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            let n = n as usize;
            if n == 0 || n > cap {
                return None;
            }
            let rows = counts.len();
            let mut row = (0..n)
                .map(|s| Some((*ids.get(s * rows + r)?, *values.get(s * rows + r)?)))
                .collect::<Option<Vec<(u32, f32)>>>()?;
            row.sort_unstable_by_key(|(c, _)| *c);
            Some(row)
        })
        .collect()
}

/// One block per (query head, tile, partition).
pub fn attention_shape(num_q_heads: usize, launch: &TileLaunch) -> LaunchShape {
    LaunchShape {
        grid: (
            num_q_heads as u32,
            launch.num_tiles() as u32,
            launch.partitions.max(1) as u32,
        ),
        block: ATTENTION_THREADS,
    }
}

/// One block per (query head, tile); a thread per output dimension, up to 256.
pub fn merge_shape(num_q_heads: usize, launch: &TileLaunch, head_dim: usize) -> LaunchShape {
    LaunchShape {
        grid: (num_q_heads as u32, launch.num_tiles() as u32, 1),
        block: head_dim.min(256) as u32,
    }
}

/// One sequence of a step as attention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSpan {
    /// The sequence's tokens in the flattened batch.
    pub tokens: Range<usize>,
    /// Position of the sequence's first token in this step.
    pub start_pos: usize,
}

/// The tiles of one kernel launch and how their contexts are split.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TileLaunch {
    /// First token (index in the batch) of each tile.
    pub start: Vec<u32>,
    /// Tokens in each tile.
    pub len: Vec<u32>,
    /// Partitions per tile (grid z); 1 unless a decode launch is split.
    pub partitions: usize,
    /// Keys per partition: a multiple of [`ATTENTION_CHUNK`] covering every tile's
    /// context when `partitions` is 1.
    pub partition_size: usize,
    /// The longest context of the launch's tiles.
    pub context: usize,
    /// Partitions per tile that would fill the GPU, before the context caps them.
    pub wanted_partitions: usize,
}

impl TileLaunch {
    pub fn is_empty(&self) -> bool {
        self.start.is_empty()
    }

    pub fn num_tiles(&self) -> usize {
        self.start.len()
    }

    /// This decode launch for a layer whose tokens attend to their last `window`
    /// positions: a tile reads from its window's start, so the partitions split the
    /// window rather than the whole context. (Decode tiles only: a prefill tile's keys
    /// span its window plus its tokens, in one partition.)
    pub fn decode_windowed(&self, window: usize) -> TileLaunch {
        let (partitions, partition_size) =
            split_context(self.context.min(window.max(1)), self.wanted_partitions);
        TileLaunch {
            partitions,
            partition_size,
            ..self.clone()
        }
    }
}

/// Partitions and keys per partition for a context of `context` keys split about
/// `wanted` ways: whole chunks per partition, at most [`MAX_PARTITIONS`], none empty.
fn split_context(context: usize, wanted: usize) -> (usize, usize) {
    let context = context.max(1);
    let chunks = context.div_ceil(ATTENTION_CHUNK);
    let parts = wanted.clamp(1, MAX_PARTITIONS).min(chunks);
    let size = round_up(context.div_ceil(parts), ATTENTION_CHUNK);
    (context.div_ceil(size), size)
}

/// The step's attention launches: decoding tokens, then prefill tiles.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttentionPlan {
    pub decode: TileLaunch,
    pub prefill: TileLaunch,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl AttentionPlan {
    /// Tiles for `seqs` with `num_q_heads` heads per rank, splitting decode contexts
    /// until there are about `target_blocks` thread blocks (twice the multiprocessors).
    pub fn new(seqs: &[SeqSpan], num_q_heads: usize, target_blocks: usize) -> Self {
        let mut plan = AttentionPlan::default();
        let (mut decode_ctx, mut prefill_ctx) = (0usize, 0usize);
        for s in seqs {
            let n = s.tokens.len();
            let ctx = s.start_pos + n;
            if n == 1 {
                plan.decode.start.push(s.tokens.start as u32);
                plan.decode.len.push(1);
                decode_ctx = decode_ctx.max(ctx);
                continue;
            }
            for first in s.tokens.clone().step_by(PREFILL_TILE) {
                let len = PREFILL_TILE.min(s.tokens.end - first);
                plan.prefill.start.push(first as u32);
                plan.prefill.len.push(len as u32);
            }
            prefill_ctx = prefill_ctx.max(ctx);
        }
        plan.prefill.partitions = 1;
        plan.prefill.partition_size = round_up(prefill_ctx.max(1), ATTENTION_CHUNK);
        plan.prefill.context = prefill_ctx;
        let blocks = plan.decode.num_tiles() * num_q_heads.max(1);
        let wanted = if blocks == 0 {
            1
        } else {
            target_blocks.div_ceil(blocks)
        };
        (plan.decode.partitions, plan.decode.partition_size) = split_context(decode_ctx, wanted);
        plan.decode.context = decode_ctx;
        plan.decode.wanted_partitions = wanted;
        plan
    }

    /// The plan of every step of `num_seqs` decoding tokens (token `i` of sequence `i`)
    /// whose contexts are at most `context` keys: one set of launches for all of them, as
    /// a replayed CUDA graph needs. Partitions past a shorter context are empty, and the
    /// merge skips them.
    pub fn decode_only(
        num_seqs: usize,
        context: usize,
        num_q_heads: usize,
        target_blocks: usize,
    ) -> Self {
        let spans: Vec<SeqSpan> = (0..num_seqs)
            .map(|i| SeqSpan {
                tokens: i..i + 1,
                start_pos: context.max(1) - 1,
            })
            .collect();
        Self::new(&spans, num_q_heads, target_blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(tokens: Range<usize>, start_pos: usize) -> SeqSpan {
        SeqSpan { tokens, start_pos }
    }

    #[test]
    fn gpus_older_than_the_kernels_are_refused_with_the_fix() {
        assert_eq!(check_compute_capability(9, 0, 90), Ok(()));
        assert_eq!(check_compute_capability(12, 0, 90), Ok(()));
        assert_eq!(check_compute_capability(8, 6, 80), Ok(()));
        let a100 = check_compute_capability(8, 0, 90).err().unwrap_or_default();
        assert!(a100.contains("CUDA_COMPUTE_CAP=80"), "{a100}");
        let t4 = check_compute_capability(7, 5, 80).err().unwrap_or_default();
        assert!(t4.contains("needs 8.0 or later"), "{t4}");
        assert!((80..=120).contains(&kernels_compute_cap()));
    }

    #[test]
    fn decoding_and_prefill_sequences_get_their_own_tiles() {
        // A prefill chunk of 40 tokens, then two decoding tokens.
        let plan = AttentionPlan::new(&[span(0..40, 10), span(40..41, 99), span(41..42, 5)], 8, 1);
        assert_eq!(plan.prefill.start, vec![0, 16, 32]);
        assert_eq!(plan.prefill.len, vec![16, 16, 8]);
        assert_eq!(
            (plan.prefill.partitions, plan.prefill.partition_size),
            (1, 128)
        );
        assert_eq!(plan.decode.start, vec![40, 41]);
        assert_eq!(plan.decode.len, vec![1, 1]);
        assert_eq!(
            (plan.decode.partitions, plan.decode.partition_size),
            (1, 128)
        );
    }

    #[test]
    fn long_decode_contexts_split_until_the_gpu_is_busy() {
        // One token, 4 heads, context 4000: 32 chunks; 264 blocks wanted -> 66
        // partitions, capped at MAX_PARTITIONS.
        let plan = AttentionPlan::new(&[span(0..1, 3999)], 4, 264);
        assert_eq!(plan.decode.partitions, MAX_PARTITIONS);
        assert_eq!(plan.decode.partition_size, 128);
        // Every partition starts inside the context and together they cover it.
        let covered = plan.decode.partitions * plan.decode.partition_size;
        assert!(covered >= 4000 && covered - plan.decode.partition_size < 4000);
        // Enough blocks already: no split.
        let many: Vec<SeqSpan> = (0..100).map(|i| span(i..i + 1, 3999)).collect();
        let plan = AttentionPlan::new(&many, 4, 264);
        assert_eq!(plan.decode.partitions, 1);
        assert!(plan.decode.partition_size >= 4000);
    }

    #[test]
    fn partitions_never_outnumber_chunks_and_always_cover_the_context() {
        for ctx in [1, 2, 127, 128, 129, 1000, 5000, 70_000] {
            for heads in [1, 3, 32] {
                for target in [1, 100, 264, 10_000] {
                    let plan = AttentionPlan::new(&[span(0..1, ctx - 1)], heads, target);
                    let d = &plan.decode;
                    assert!(d.partitions >= 1 && d.partitions <= MAX_PARTITIONS);
                    assert_eq!(d.partition_size % ATTENTION_CHUNK, 0);
                    assert!(d.partitions * d.partition_size >= ctx, "ctx {ctx}");
                    assert!((d.partitions - 1) * d.partition_size < ctx, "ctx {ctx}");
                }
            }
        }
    }

    #[test]
    fn a_decode_only_plan_serves_every_shorter_context() {
        // Four decoding sequences, contexts up to 2048, 8 heads, 264 blocks wanted.
        let bound = AttentionPlan::decode_only(4, 2048, 8, 264);
        assert_eq!(bound.decode.start, vec![0, 1, 2, 3]);
        assert_eq!(bound.decode.len, vec![1; 4]);
        assert!(bound.prefill.is_empty());
        let covered = bound.decode.partitions * bound.decode.partition_size;
        assert!(covered >= 2048);
        // The same tiles as a real step of four decoding tokens; only the split differs.
        let real = AttentionPlan::new(
            &[
                span(0..1, 9),
                span(1..2, 700),
                span(2..3, 0),
                span(3..4, 2047),
            ],
            8,
            264,
        );
        assert_eq!(
            (real.decode.start, real.decode.len),
            (bound.decode.start, bound.decode.len)
        );
    }

    #[test]
    fn windowed_decodes_split_their_window_not_their_context() {
        // 8 sequences x 32 heads at 32k context nearly fill the GPU: 2 partitions of 16k,
        // so a 4096 window would sit in one partition and leave half the blocks idle.
        let seqs: Vec<SeqSpan> = (0..8).map(|i| span(i..i + 1, 32_767)).collect();
        let plan = AttentionPlan::new(&seqs, 32, 264);
        assert_eq!(plan.decode.partitions, 2);
        let w = plan.decode.decode_windowed(4096);
        assert_eq!((w.partitions, w.partition_size), (2, 2048));
        assert_eq!(
            (w.start.clone(), w.len.clone()),
            (plan.decode.start.clone(), plan.decode.len.clone())
        );
        // A window longer than the context changes nothing; every split covers its span.
        assert_eq!(plan.decode.decode_windowed(100_000), plan.decode);
        for window in [1, 100, 128, 129, 4096, 40_000] {
            let w = plan.decode.decode_windowed(window);
            let span = window.min(32_768);
            assert!(w.partitions * w.partition_size >= span, "window {window}");
            assert!(
                (w.partitions - 1) * w.partition_size < span,
                "window {window}"
            );
        }
    }

    #[test]
    fn kernel_names_and_head_dims() {
        assert_eq!(
            attention_kernel(KvDtype::Bf16, 128, 16),
            "paged_attention_bf16_hd128_q16"
        );
        assert_eq!(merge_kernel(KvDtype::F16, 64), "attention_merge_f16_hd64");
        assert!(check_head_dim(80).is_ok());
        let err = check_head_dim(72).err().unwrap_or_default();
        assert!(err.contains("72") && err.contains("128"), "{err}");
    }
}
