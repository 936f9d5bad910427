//! The decoder layers on a CUDA rank.
//!
//! The residual stream stays in f32; each RMSNorm output is rounded to bf16 for the
//! column-parallel matmuls (fused QKV, fused gate/up: cuBLAS, or candle's quantized
//! kernels). RoPE and the KV-cache write are one kernel, attention reads the paged cache
//! (`kernels/cuda`), and the row-parallel matmuls (o_proj, down) return f32 partial sums
//! for the all-reduce. Nothing leaves the device but the sampled rows' logits.

use candle_core::{DType, Tensor};
use tessera_kernels::gpu::launch::AttentionPlan;

use super::gpu_parts::GpuParts;
use super::shard::{final_logits, Block, DecoderShard, Mlp};
use crate::device::buffers::Gpu;
use crate::device::dtype::{candle_dtype, ACTIVATIONS};
use crate::error::{EngineError, Result};
use crate::model::batch::Batch;
use crate::model::cuda::graph_plan::GraphKey;
use crate::model::cuda::kernels::{self, HeadLayout, LayerAttention};
use crate::model::cuda::step_meta::StepMeta;
use crate::model::cuda::{gated_mlp, kv_store, CudaKvCache};
use crate::model::head_norms::{AcrossHeads, HeadNorms};
use crate::model::kv_groups::LayerSlot;
use crate::model::linear::Linear;
use crate::model::step_meta::PackedMeta;
use crate::tp::Communicator;

/// The per-head RMSNorm of the queries and keys in a fused QKV row (Qwen3, Gemma 3),
/// before RoPE:
/// each head's `head_dim` values normalized in f32 with the weights of its kind.
fn head_norms(qkv: &Tensor, norms: &HeadNorms, heads: HeadLayout, eps: f32) -> Result<Tensor> {
    let w = norms.device_weights()?;
    let (q_w, k_w) = (&w.q, &w.k);
    let n = qkv.dim(0)?;
    let hd = heads.head_dim;
    let (nq, nkv) = (heads.num_q_heads, heads.num_kv_heads);
    let norm = |first: usize, count: usize, w: &Tensor| -> Result<Tensor> {
        let part = qkv
            .narrow(1, first * hd, count * hd)?
            .contiguous()?
            .to_dtype(DType::F32)?
            .reshape((n * count, hd))?;
        Ok(candle_nn::ops::rms_norm(&part, w, eps)?
            .reshape((n, count * hd))?
            .to_dtype(qkv.dtype())?)
    };
    let q = norm(0, nq, q_w)?;
    let k = norm(nq, nkv, k_w)?;
    let v = qkv.narrow(1, (nq + nkv) * hd, nkv * hd)?;
    Ok(Tensor::cat(&[&q, &k, &v], 1)?.contiguous()?)
}

/// OLMo 2's query and key norms across all of a token's heads, on `qkv` (`[n, width]`
/// in the activation type): each rank's sums of squares (f32; a KV head held by several
/// ranks weighted by its share) are all-reduced, and each rank scales its heads by the
/// whole's RMS and its slice of the weights.
fn norms_across_heads(
    qkv: &Tensor,
    norms: &HeadNorms,
    across: &AcrossHeads,
    heads: HeadLayout,
    comm: &mut dyn Communicator,
    eps: f32,
) -> Result<Tensor> {
    let w = norms.device_weights()?;
    let (q_w, k_w) = (&w.q, &w.k);
    let share = w
        .k_share
        .as_ref()
        .ok_or_else(|| EngineError::Step("KV head shares were not loaded on the GPU".into()))?;
    let n = qkv.dim(0)?;
    let hd = heads.head_dim;
    let (nq, nkv) = (heads.num_q_heads, heads.num_kv_heads);
    let q = qkv.narrow(1, 0, nq * hd)?.to_dtype(DType::F32)?;
    let k = qkv.narrow(1, nq * hd, nkv * hd)?.to_dtype(DType::F32)?;
    let q_sum = q.sqr()?.sum_keepdim(1)?;
    let k_sum = k
        .reshape((n, nkv, hd))?
        .sqr()?
        .sum(2)?
        .broadcast_mul(share)?
        .sum_keepdim(1)?;
    let total = comm.all_reduce_sum(&Tensor::cat(&[&q_sum, &k_sum], 1)?.contiguous()?)?;
    let scale = |col: usize, dims: usize| -> Result<Tensor> {
        Ok(
            ((total.narrow(1, col, 1)? / dims as f64)? + f64::from(eps))?
                .sqrt()?
                .recip()?,
        )
    };
    let q = q
        .broadcast_mul(&scale(0, across.q_dims)?)?
        .broadcast_mul(&q_w.unsqueeze(0)?)?;
    let k = k
        .broadcast_mul(&scale(1, across.k_dims)?)?
        .broadcast_mul(&k_w.unsqueeze(0)?)?;
    let v = qkv.narrow(1, (nq + nkv) * hd, nkv * hd)?;
    Ok(Tensor::cat(
        &[&q.to_dtype(qkv.dtype())?, &k.to_dtype(qkv.dtype())?, &v],
        1,
    )?
    .contiguous()?)
}

impl DecoderShard {
    fn gpu(&self) -> Result<&GpuParts> {
        self.gpu
            .as_ref()
            .ok_or_else(|| EngineError::Step("this shard was not loaded for a CUDA device".into()))
    }

    /// This shard's decoder layers over the f32 hidden states `x` on its GPU. Between the
    /// halves of each layer one kernel adds the half's output to the residual stream and
    /// normalizes the result for the next matmul.
    pub(crate) fn layers_cuda(
        &self,
        x: Tensor,
        batch: &Batch,
        cache: &mut CudaKvCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let sinks = &self.gpu()?.sinks;
        self.blocks_cuda((&self.blocks, &self.kv_slots, sinks), x, batch, cache, comm)
    }

    /// The step's metadata on the device: one upload per KV group, its slots and block
    /// tables (hybrid groups; one group otherwise). Each layer reads its group's.
    pub(crate) fn step_metas(&self, batch: &Batch, cache: &CudaKvCache) -> Result<Vec<StepMeta>> {
        let gpu = self.gpu()?;
        batch
            .group_views()?
            .iter()
            .map(|view| {
                let packed = PackedMeta::new(view, &gpu.kv_of_q, gpu.target_blocks)?;
                StepMeta::upload(packed, cache.block_size, &self.device)
            })
            .collect()
    }

    /// `blocks` over the f32 hidden states `x` on the GPU, block `i` keeping its KV where
    /// `slots[i]` says, with `sinks[i]` (none past the slice's end).
    pub(super) fn blocks_cuda(
        &self,
        parts: (&[Block], &[LayerSlot], &[Option<Tensor>]),
        x: Tensor,
        batch: &Batch,
        cache: &mut CudaKvCache,
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let metas = self.step_metas(batch, cache)?;
        self.blocks_with_metas(parts, x, &metas, cache, comm, false)
    }

    /// `blocks` over `x` with the step's metadata already on the device (`metas[g]` for
    /// KV group `g`). With `graphed` (a decode graph's step) mixtures of experts route on
    /// the device, so that nothing here reads the step from the host and a CUDA graph can
    /// record it; eager steps route on the host, whose grouped products give a token the
    /// same result whatever else is in the step.
    pub(super) fn blocks_with_metas(
        &self,
        (blocks, slots, sinks): (&[Block], &[LayerSlot], &[Option<Tensor>]),
        x: Tensor,
        metas: &[StepMeta],
        cache: &mut CudaKvCache,
        comm: &mut dyn Communicator,
        graphed: bool,
    ) -> Result<Tensor> {
        let gpu = self.gpu()?;
        let gpu_dev = Gpu::of(&self.device)?;
        let eps = self.config.rms_norm_eps as f32;
        let scale = self
            .config
            .attention_scale
            .unwrap_or(1.0 / (self.config.head_dim as f32).sqrt());
        let act = candle_dtype(ACTIVATIONS);
        let heads = HeadLayout {
            num_q_heads: self.shard.q_heads.len(),
            num_kv_heads: self.shard.kv_heads.len(),
            head_dim: self.config.head_dim,
        };
        if cache.k.len() != self.num_kv_slots() {
            return Err(EngineError::Step(format!(
                "the cache has {} layer slots, the shard's layers use {}",
                cache.k.len(),
                self.num_kv_slots()
            )));
        }
        let Some(first) = blocks.first() else {
            return Ok(x);
        };
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let add_norm = |x: &Tensor, delta: Option<&Tensor>, norm: Option<&Tensor>| match norm {
            Some(w) => kernels::add_rms_norm(gpu_dev, ACTIVATIONS, x, delta, w, eps),
            // OLMo 2: the next half reads the residual stream itself.
            None => {
                let x = match delta {
                    Some(d) => (x + d)?,
                    None => x.clone(),
                };
                let h = x.to_dtype(act)?;
                Ok((x, h))
            }
        };
        let (mut x, mut h) = add_norm(&x, None, first.attn_norm.as_ref())?;
        for (i, block) in blocks.iter().enumerate() {
            // Attention half, on h = norm(x).
            let mut qkv = block.qkv.forward_fused(&h)?.to_dtype(act)?.contiguous()?;
            match &block.qk_norm {
                Some(
                    norms @ HeadNorms {
                        across: Some(a), ..
                    },
                ) => qkv = norms_across_heads(&qkv, norms, a, heads, comm, eps)?,
                Some(norms) => qkv = head_norms(&qkv, norms, heads, eps)?,
                None => {}
            }
            let rope = match (&gpu.rope_sliding, block.sliding) {
                _ if !block.rotates => gpu.rope_unrotated.as_ref().ok_or_else(|| {
                    EngineError::Step("a layer without RoPE, but no identity tables".into())
                })?,
                (Some(r), true) => r,
                _ => &gpu.rope,
            };
            let (slot, meta) = match slots.get(i) {
                Some(at) => (at.slot, metas.get(at.group)),
                None => (i, None),
            };
            let meta = meta.ok_or_else(|| {
                EngineError::Step(format!("layer {i} has no KV group in this step"))
            })?;
            kv_store::write_kv(gpu_dev, ACTIVATIONS, &qkv, cache, slot, meta, rope, heads)?;
            let layer = LayerAttention {
                window: block
                    .sliding
                    .then(|| self.config.sliding_window.as_ref().map(|sw| sw.window))
                    .flatten(),
                scale,
                softcap: self.config.attn_logit_softcapping,
                sinks: sinks.get(i).and_then(Option::as_ref),
            };
            let kv = cache
                .layer(slot)
                .ok_or_else(|| EngineError::Step(format!("the cache has no layer slot {slot}")))?;
            let attn =
                kernels::paged_attention(gpu_dev, ACTIVATIONS, &qkv, kv, meta, heads, layer)?;
            let mut o = comm.all_reduce_sum(&block.o_proj.forward_f32(&attn)?)?;
            if let Some(w) = &block.post_attn_norm {
                o = candle_nn::ops::rms_norm(&o.contiguous()?, w, eps)?;
            }
            let o = self.to_residual(o)?;
            (x, h) = add_norm(&x, Some(&o), block.ffn_norm.as_ref())?;
            // MLP half.
            let partial = match &block.mlp {
                Mlp::Dense { gate_up, down } => {
                    gated_mlp(gate_up, down, &h, self.config.activation.into())?
                }
                Mlp::Experts(experts) => experts.forward_cuda(&h, graphed)?,
            };
            let mut d = comm.all_reduce_sum(&partial)?;
            if let Some(w) = &block.post_ffn_norm {
                d = candle_nn::ops::rms_norm(&d.contiguous()?, w, eps)?;
            }
            let d = self.to_residual(d)?;
            match blocks.get(i + 1) {
                Some(next) => (x, h) = add_norm(&x, Some(&d), next.attn_norm.as_ref())?,
                None => x = (x + d)?,
            }
        }
        Ok(x)
    }

    /// `norm`, then `head`, over the sampled rows of `x` on the GPU: f32 logits
    /// `[rows, vocab]`.
    pub(crate) fn head_cuda(
        &self,
        x: &Tensor,
        batch: &Batch,
        head: (&Tensor, &Linear),
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let rows: Vec<u32> = batch.sample_rows.iter().map(|r| *r as u32).collect();
        let rows = Tensor::from_slice(&rows, rows.len(), &self.device)?;
        let last = x.index_select(&rows, 0)?;
        self.head_on_rows(&last, head, comm)
    }

    /// `norm`, then `head`, over every row of `rows` (f32 hidden states): f32 logits.
    fn head_on_rows(
        &self,
        rows: &Tensor,
        (norm, head): (&Tensor, &Linear),
        comm: &mut dyn Communicator,
    ) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps as f32;
        let last = candle_nn::ops::rms_norm(&rows.contiguous()?, norm, eps)?
            .to_dtype(candle_dtype(ACTIVATIONS))?;
        let logits = final_logits(head.forward_f32(&last)?, &self.config)?;
        comm.all_gather(&logits, 1)
    }

    /// Why a CUDA graph cannot record this shard's decode step, if it cannot: the step
    /// must run on the device alone, from buffers written before it.
    pub(crate) fn graph_refusal(&self) -> Option<String> {
        if self.gpu.is_none() {
            return Some("the shard does not take the GPU path".into());
        }
        if self.embedding.is_none() || self.lm_head.is_none() {
            return Some("the model is split into pipeline stages".into());
        }
        if let Some(why) = self.blocks.iter().find_map(|b| match &b.mlp {
            Mlp::Experts(experts) => experts.graph_refusal(),
            Mlp::Dense { .. } => None,
        }) {
            return Some(why);
        }
        if self.has_mtp() {
            return Some("the MTP layer reads the step's hidden states".into());
        }
        if self.kv_slots.iter().any(|s| s.group > 0) {
            return Some("layers keep KV in more than one group of block tables".into());
        }
        None
    }

    /// The vocabulary's size: the width of the logits.
    pub(crate) fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    /// `batch` (a padded decode step) packed as graph `key` reads it: block-table rows of
    /// `max_blocks`, and the attention launches of every step the graph serves.
    pub(crate) fn graph_meta(
        &self,
        batch: &Batch,
        max_blocks: usize,
        key: GraphKey,
    ) -> Result<PackedMeta> {
        let gpu = self.gpu()?;
        let heads = gpu.kv_of_q.len();
        let plan = AttentionPlan::decode_only(key.rows, key.context, heads, gpu.target_blocks);
        PackedMeta::pack(batch, &gpu.kv_of_q, max_blocks, plan)
    }

    /// One decode step as a CUDA graph records it: the tokens in `tokens` (`[rows]`),
    /// the metadata in `meta`, the logits of every row written to the first rows of
    /// `out` (`[rows or more, vocab]`, f32). Everything it reads from the step is in those
    /// device buffers.
    pub(crate) fn decode_graph_body(
        &self,
        tokens: &Tensor,
        meta: &StepMeta,
        cache: &mut CudaKvCache,
        comm: &mut dyn Communicator,
        out: &Tensor,
    ) -> Result<()> {
        let x = self.embed_ids(tokens)?;
        let sinks = &self.gpu()?.sinks;
        let x = self.blocks_with_metas(
            (&self.blocks, &self.kv_slots, sinks),
            x,
            std::slice::from_ref(meta),
            cache,
            comm,
            true,
        )?;
        let head = Self::part(&self.lm_head, "LM head")?;
        let logits = self.head_on_rows(&x, (&self.norm, head), comm)?;
        out.slice_set(&logits, 0, 0)?;
        Ok(())
    }
}
