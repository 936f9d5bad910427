//! A step as the engine packs it for the kernels, over scattered cache blocks.
// Each test binary uses part of this module.
#![allow(dead_code)]

use tessera_engine::model::batch::Batch;
use tessera_engine::model::step_meta::{PackedMeta, Part};
use tessera_kernels::gpu::reference::{scattered, Lcg, StepSeq};
use tessera_kernels_emulated::{Element, StepTables};

/// Multiprocessors × 2 on an H100; only decides how decode contexts are split.
pub const TARGET_BLOCKS: usize = 264;

/// A step of sequences `(start_pos, new tokens)` packed by the engine's `PackedMeta`.
pub struct Step {
    pub seqs: Vec<StepSeq>,
    pub num_blocks: usize,
    pub block_size: usize,
    pub meta: PackedMeta,
}

impl Step {
    pub fn new(seqs: &[(usize, usize)], block_size: usize, kv_of_q: &[u32], rng: &mut Lcg) -> Self {
        let (seqs, num_blocks) = scattered(seqs, block_size, rng);
        let batch = Batch::of_steps(&seqs, block_size);
        let meta = PackedMeta::new(&batch, kv_of_q, TARGET_BLOCKS).expect("pack the step");
        Step {
            seqs,
            num_blocks,
            block_size,
            meta,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.meta.num_tokens
    }

    pub fn tables(&self) -> StepTables<'_> {
        let part = |p: Part| &self.meta.values[self.meta.range(p)];
        StepTables {
            positions: part(Part::Positions),
            slots: part(Part::Slots),
            seq_of_token: part(Part::SeqOfToken),
            block_tables: part(Part::BlockTables),
            max_blocks: self.meta.max_blocks,
            kv_of_q: part(Part::KvOfQ),
            block_size: self.block_size,
            plan: &self.meta.plan,
        }
    }
}

/// Each query head's KV head under grouped-query attention.
pub fn kv_of_q(num_q_heads: usize, num_kv_heads: usize) -> Vec<u32> {
    (0..num_q_heads)
        .map(|h| (h / (num_q_heads / num_kv_heads)) as u32)
        .collect()
}

/// `values` in the element type, and those elements back in f32 (what the kernel sees).
pub fn rounded<T: Element>(values: &[f32]) -> (Vec<T>, Vec<f32>) {
    let t: Vec<T> = values.iter().map(|v| T::from_f32(*v)).collect();
    let back = t.iter().map(|v| v.to_f32()).collect();
    (t, back)
}

pub fn to_f32<T: Element>(values: &[T]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}
