//! The decoder layers on a CPU rank: our SIMD kernels over host buffers, attention over
//! the paged host cache, each layer half joined by one all-reduce.

use candle_core::Tensor;

use super::shard::{final_logits, Block, DecoderShard, Mlp};
use crate::error::{EngineError, Result};
use crate::model::batch::Batch;
use crate::model::cpu_ops;
use crate::model::head_norms::{norm_across_heads, HeadNorms};
use crate::model::kv_cache::KvCache;
use crate::model::kv_groups::LayerSlot;
use crate::model::kv_write::write_kv;
use crate::model::linear::Linear;
use crate::model::paged_attention::{attend, AttentionShape};
use crate::tp::Communicator;

impl DecoderShard {
    /// The decoder layers on CPU: our SIMD kernels over host buffers.
    pub(super) fn layers_cpu(
        &self,
        x: Tensor,
        batch: &Batch,
        cache: &mut KvCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        self.blocks_cpu(&self.blocks, &self.kv_slots, x, batch, cache, comm)
    }

    /// `blocks` over `x` on CPU, block `i` keeping its KV where `slots[i]` says.
    pub(super) fn blocks_cpu(
        &self,
        blocks: &[Block],
        slots: &[LayerSlot],
        mut x: Tensor,
        batch: &Batch,
        cache: &mut KvCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let n = batch.num_tokens();
        let eps = self.config.rms_norm_eps as f32;
        let hd = self.config.head_dim;
        let nq = self.shard.q_heads.len();
        let nkv = self.shard.kv_heads.len();
        let full = AttentionShape {
            num_q_heads: nq,
            head_dim: hd,
            groups: &self.query_groups,
            scale: self
                .config
                .attention_scale
                .unwrap_or(1.0 / (hd as f32).sqrt()),
            window: None,
            softcap: self.config.attn_logit_softcapping,
            sinks: None,
        };
        let sliding = AttentionShape {
            window: self.config.sliding_window.as_ref().map(|sw| sw.window),
            ..full
        };
        // Hybrid KV groups: each group's layers address the cache through its own slots
        // and tables.
        let views = batch.group_views()?;
        let mut layers = std::mem::take(&mut cache.layers);
        let result = (|| -> Result<Tensor> {
            for (block, at) in blocks.iter().zip(slots) {
                let (Some(layer_cache), Some(kv_batch)) =
                    (layers.get_mut(at.slot), views.get(at.group))
                else {
                    return Err(EngineError::Step(format!(
                        "a layer in KV slot {} of group {}: the cache has {} slots, the step \
                         {} groups",
                        at.slot,
                        at.group,
                        layers.len(),
                        views.len()
                    )));
                };
                let h = match &block.attn_norm {
                    Some(w) => cpu_ops::rms_norm(&x, w, eps)?,
                    None => x.clone(),
                };
                let [mut q, mut k, v]: [Vec<f32>; 3] =
                    block.qkv.forward_vecs(&h)?.try_into().map_err(|_| {
                        EngineError::Parallel("qkv: expected three segments".into())
                    })?;
                match &block.qk_norm {
                    Some(
                        norms @ HeadNorms {
                            across: Some(a), ..
                        },
                    ) => norm_across_heads(&mut q, &mut k, n, norms, a, comm, eps)?,
                    Some(norms) => {
                        cpu_ops::rms_norm_heads(&mut q, &norms.q, eps);
                        cpu_ops::rms_norm_heads(&mut k, &norms.k, eps);
                    }
                    None => {}
                }
                let (rope, shape) = match (&self.rope_sliding, block.sliding) {
                    (Some(r), true) => (r, sliding),
                    _ => (&self.rope, full),
                };
                let shape = AttentionShape {
                    sinks: block.sinks.as_deref(),
                    ..shape
                };
                if block.rotates {
                    for (t, &pos) in batch.positions.iter().enumerate() {
                        rope.apply(&mut q[t * nq * hd..(t + 1) * nq * hd], pos);
                        rope.apply(&mut k[t * nkv * hd..(t + 1) * nkv * hd], pos);
                    }
                }
                write_kv(layer_cache, cache, kv_batch, &k, &v);
                let attn = attend(layer_cache, cache, kv_batch, &q, shape);
                let attn = Tensor::from_vec(attn, (n, nq * hd), &self.device)?;
                let mut o = comm.all_reduce_sum(&block.o_proj.forward(&attn)?)?;
                if let Some(w) = &block.post_attn_norm {
                    o = cpu_ops::rms_norm(&o, w, eps)?;
                }
                x = cpu_ops::add(&x, &self.to_residual(o)?)?;
                let h = match &block.ffn_norm {
                    Some(w) => cpu_ops::rms_norm(&x, w, eps)?,
                    None => x.clone(),
                };
                let partial = match &block.mlp {
                    Mlp::Dense { gate_up, down } => {
                        down.forward(&gate_up.forward_gated(&h, self.config.activation)?)?
                    }
                    Mlp::Experts(experts) => experts.forward(&h)?,
                };
                let mut d = comm.all_reduce_sum(&partial)?;
                if let Some(w) = &block.post_ffn_norm {
                    d = cpu_ops::rms_norm(&d, w, eps)?;
                }
                x = cpu_ops::add(&x, &self.to_residual(d)?)?;
            }
            Ok(x)
        })();
        cache.layers = layers;
        result
    }

    /// `norm`, then `head`, over the sampled rows of `x` on the host: logits
    /// `[rows, vocab]`.
    pub(super) fn head_cpu(
        &self,
        x: &Tensor,
        batch: &Batch,
        (norm, head): (&Tensor, &Linear),
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps as f32;
        let rows: Vec<u32> = batch.sample_rows.iter().map(|r| *r as u32).collect();
        let rows = Tensor::from_slice(&rows, rows.len(), &self.device)?;
        let last = x.index_select(&rows, 0)?;
        let last = cpu_ops::rms_norm(&last, norm, eps)?;
        let logits = final_logits(head.forward(&last)?, &self.config)?;
        comm.all_gather(&logits, 1)
    }
}
