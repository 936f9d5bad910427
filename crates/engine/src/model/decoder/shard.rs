//! One rank's part of the decoder: its blocks (each layer's weights on this rank), the
//! embedding, final norm and LM head, the RoPE tables, and on a CUDA rank what its kernels
//! need beside the weights. Loaded by `load`, run by `forward` through its CPU or CUDA
//! half.

use std::sync::Arc;

use candle_core::{Device, Tensor};

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
use super::gpu_parts::GpuParts;
use crate::error::Result;
use crate::loader::source::Embedding;
use crate::model::head_norms::HeadNorms;
use crate::model::kv_cache::{CacheShape, KvCacheDtype};
use crate::model::kv_groups::{slots_needed, LayerSlot};
use crate::model::linear::{ColumnParallel, Linear};
use crate::model::moe::MoeShard;
use crate::model::paged_attention::QueryGroup;
use crate::model::rope::RopeTable;
use crate::spec::model::ModelConfig;
use crate::tp::RankShard;

#[derive(Debug)]
pub(super) struct Block {
    /// The attention half's input norm (`None`: OLMo 2 normalizes outputs only).
    pub(super) attn_norm: Option<Tensor>,
    pub(super) qkv: ColumnParallel,
    /// RMSNorm weights of queries and keys, where the model has them: per head
    /// (`head_dim` each, the same on every rank), or across all heads (OLMo 2: this
    /// rank's slice of them).
    pub(super) qk_norm: Option<HeadNorms>,
    /// Gemma's norms of the attention and MLP outputs.
    pub(super) post_attn_norm: Option<Tensor>,
    pub(super) post_ffn_norm: Option<Tensor>,
    /// A sliding-window layer (attends to the model's window, rotates with its own base).
    pub(super) sliding: bool,
    /// Queries and keys are rotated (false in SmolLM3's layers without RoPE).
    pub(super) rotates: bool,
    /// gpt-oss's sink logit of each of this rank's query heads.
    pub(super) sinks: Option<Vec<f32>>,
    /// Row-parallel; a bias (gpt-oss) is added by the first rank only, so the all-reduce
    /// counts it once.
    pub(super) o_proj: Linear,
    /// The MLP half's input norm (`None` for OLMo 2).
    pub(super) ffn_norm: Option<Tensor>,
    pub(super) mlp: Mlp,
}

/// The MLP half of a layer.
#[derive(Debug)]
pub(super) enum Mlp {
    Dense {
        gate_up: ColumnParallel,
        down: Linear,
    },
    Experts(MoeShard),
}

/// One rank's part of the multi-token-prediction layer (`super::mtp`).
#[derive(Debug)]
pub(crate) struct MtpLayer {
    pub(super) enorm: Tensor,
    pub(super) hnorm: Tensor,
    /// `[hidden, 2·hidden]`, whole on every rank.
    pub(super) eh_proj: Linear,
    pub(super) block: Block,
    /// Where the layer keeps its KV: the slot after the decoder layers', group 0's
    /// tables.
    pub(super) slot: LayerSlot,
    /// `shared_head.norm`.
    pub(super) norm: Tensor,
    /// `shared_head.head`, this rank's rows of the vocabulary; `None`: the model's head.
    pub(super) head: Option<Linear>,
}

/// One rank's part of the model. Owned by that rank's worker thread.
#[derive(Debug)]
pub struct DecoderShard {
    pub(super) config: ModelConfig,
    pub(super) shard: RankShard,
    /// The token embedding; `None` on a pipeline stage after the first.
    pub(super) embedding: Option<Embedding>,
    pub(super) blocks: Vec<Block>,
    pub(super) norm: Tensor,
    /// The LM head; `None` on a pipeline stage before the last.
    pub(super) lm_head: Option<Linear>,
    pub(super) rope: Arc<RopeTable>,
    /// RoPE of the sliding-window layers, where they have their own base.
    pub(super) rope_sliding: Option<Arc<RopeTable>>,
    pub(super) query_groups: Vec<QueryGroup>,
    /// Per block, the KV group whose table it reads and the cache slot it uses (see
    /// [`crate::model::kv_groups`]); by default one group, block `i` in slot `i`.
    pub(super) kv_slots: Vec<LayerSlot>,
    /// The multi-token-prediction layer, where `mtp` speculation loaded it.
    pub(super) mtp: Option<MtpLayer>,
    pub(super) device: Device,
    /// The RoPE tables and launch facts of a CUDA rank.
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    pub(super) gpu: Option<GpuParts>,
}

impl DecoderShard {
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether this shard runs the CUDA ranks' forward pass (its KV cache, our kernels).
    pub fn runs_gpu_path(&self) -> bool {
        #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
        return self.gpu.is_some();
        #[cfg(not(any(feature = "cuda", feature = "gpu-emulation")))]
        false
    }

    /// Test builds: this host shard takes the CUDA ranks' forward pass, our CUDA kernels
    /// emulated (its weights stay as loaded for the host; each matmul reads its input in
    /// their type).
    #[cfg(feature = "gpu-emulation")]
    pub(crate) fn take_gpu_path(&mut self) -> Result<()> {
        let kv_of_q = self.shard.local_kv_of_q(self.config.group_size());
        self.gpu = Some(GpuParts::new(
            &self.device,
            &self.config,
            (&self.rope, self.rope_sliding.as_deref()),
            &kv_of_q,
            self.blocks.iter().map(|b| b.sinks.as_deref()),
        )?);
        let mtp_block = self.mtp.as_mut().map(|m| &mut m.block);
        for block in self.blocks.iter_mut().chain(mtp_block) {
            if let Some(norms) = &mut block.qk_norm {
                norms.on_device = Some(norms.tensors(&self.device)?);
            }
        }
        Ok(())
    }

    /// Where this shard's layers keep their KV: one entry per block, in order. The
    /// engine sets it from the model's [`crate::model::kv_groups::KvGrouping`] before
    /// the cache is made.
    pub fn set_kv_slots(&mut self, slots: Vec<LayerSlot>) -> Result<()> {
        if slots.len() != self.blocks.len() {
            return Err(crate::error::EngineError::Config(format!(
                "KV slots for {} layers on a shard of {}",
                slots.len(),
                self.blocks.len()
            )));
        }
        if let Some(mtp) = &mut self.mtp {
            mtp.slot = LayerSlot {
                group: 0,
                slot: slots_needed(&slots),
            };
        }
        self.kv_slots = slots;
        Ok(())
    }

    /// Slot tensors this shard's cache holds: its layers', and the MTP layer's.
    pub fn num_kv_slots(&self) -> usize {
        slots_needed(&self.kv_slots) + usize::from(self.mtp.is_some())
    }

    /// The KV cache of `dtype` this shard's layers read and write: one slot tensor per
    /// slot its layers use.
    pub fn cache_shape(&self, dtype: KvCacheDtype) -> CacheShape {
        CacheShape {
            dtype,
            layers: self.num_kv_slots(),
            kv_heads: self.num_local_kv_heads(),
            head_dim: self.head_dim(),
            gpu_path: self.runs_gpu_path(),
            device: self.device.clone(),
        }
    }

    /// A part this shard was loaded without (a pipeline stage holds the embedding only
    /// if it is the first, the head only if it is the last).
    pub(super) fn part<'a, T>(part: &'a Option<T>, what: &str) -> Result<&'a T> {
        part.as_ref().ok_or_else(|| {
            crate::error::EngineError::Parallel(format!(
                "this pipeline stage was loaded without the {what}"
            ))
        })
    }

    pub fn num_local_kv_heads(&self) -> usize {
        self.shard.kv_heads.len()
    }

    /// Decoder layers this shard runs.
    pub fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    pub fn head_dim(&self) -> usize {
        self.config.head_dim
    }

    /// A layer half's output as it joins the residual stream: times Granite's residual
    /// multiplier, where the model has one.
    pub(crate) fn to_residual(&self, out: Tensor) -> Result<Tensor> {
        Ok(match self.config.residual_multiplier {
            Some(m) if m != 1.0 => (out * f64::from(m))?,
            _ => out,
        })
    }
}

/// The LM head's logits as the model ends: divided by Granite's logits scaling, and
/// capped to Gemma 2's `cap · tanh(logit / cap)`, on this rank's slice of the vocabulary
/// (element by element, so before the gather as after it).
pub(crate) fn final_logits(mut logits: Tensor, config: &ModelConfig) -> Result<Tensor> {
    if let Some(s) = config.logits_scaling.filter(|s| *s != 1.0) {
        logits = (logits / f64::from(s))?;
    }
    Ok(match config.final_logit_softcapping {
        Some(cap) => ((logits / f64::from(cap))?.tanh()? * f64::from(cap))?,
        None => logits,
    })
}
