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
}

impl TileLaunch {
    pub fn is_empty(&self) -> bool {
        self.start.is_empty()
    }

    pub fn num_tiles(&self) -> usize {
        self.start.len()
    }
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
        let blocks = plan.decode.num_tiles() * num_q_heads.max(1);
        let chunks = decode_ctx.max(1).div_ceil(ATTENTION_CHUNK);
        let wanted = if blocks == 0 {
            1
        } else {
            target_blocks.div_ceil(blocks)
        };
        let parts = wanted.clamp(1, MAX_PARTITIONS).min(chunks);
        let size = round_up(decode_ctx.max(1).div_ceil(parts), ATTENTION_CHUNK);
        plan.decode.partition_size = size;
        plan.decode.partitions = decode_ctx.max(1).div_ceil(size);
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(tokens: Range<usize>, start_pos: usize) -> SeqSpan {
        SeqSpan { tokens, start_pos }
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
