//! The multi-token-prediction (MTP) layer GLM-4.5 ships after its decoder layers
//! (DeepSeek-V3's design), the source of `mtp` speculation's guesses.
//!
//! At position `p` it reads the model's final hidden state there (after the final norm)
//! and the embedding of the token at `p + 1`: each RMS-normalized by its own weights
//! (`hnorm`, `enorm`; the embedding is zero at position 0), concatenated embedding first,
//! projected back to the hidden width (`eh_proj`), then through one more decoder layer
//! with a KV cache slot of its own, whose output, normed by `shared_head.norm` and put
//! through `shared_head.head` (the model's LM head where the checkpoint has none), scores
//! the token at `p + 2`. A further guess feeds the layer its own output at the previous
//! position in place of the model's hidden state. This follows vLLM's reading of these
//! checkpoints.
//!
//! Every rank holds the whole projection (it is one matrix of `hidden × 2·hidden`, small
//! beside the layer's experts) and its own part of the layer and the head, split as the
//! model's own layers and head are.

use candle_core::{DType, Tensor};

use super::shard::{Block, DecoderShard, MtpLayer};
use crate::error::{EngineError, Result};
use crate::model::batch::Batch;
use crate::model::kv_cache::RankCache;
use crate::model::kv_groups::LayerSlot;
use crate::model::linear::Linear;
use crate::tp::Communicator;

/// The layer's tensors beyond its decoder block, as GLM-4.5's checkpoints name them
/// under `model.layers.{num_layers}.`.
pub(crate) const EH_PROJ: &str = "eh_proj.weight";
pub(crate) const ENORM: &str = "enorm.weight";
pub(crate) const HNORM: &str = "hnorm.weight";
pub(crate) const SHARED_NORM: &str = "shared_head.norm.weight";
pub(crate) const SHARED_HEAD: &str = "shared_head.head.weight";

impl DecoderShard {
    /// Whether this shard holds an MTP layer.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    fn mtp_layer(&self) -> Result<&MtpLayer> {
        self.mtp
            .as_ref()
            .ok_or_else(|| EngineError::Step("this model was loaded without its MTP layer".into()))
    }

    /// The model's final norm over `x` (`[rows, hidden]`, the decoder layers' output):
    /// the hidden states the MTP layer reads.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps as f32;
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        Ok(candle_nn::ops::rms_norm(&x, &self.norm, eps)?)
    }

    /// The MTP layer over `batch` (each row's token is the one after its position),
    /// reading `hidden` (`[rows, hidden]`: the model's normed hidden state at each row's
    /// position, or the layer's own output at the position before). Returns the layer's
    /// output `[rows, hidden]` and the logits of `batch.sample_rows`.
    pub fn mtp(
        &self,
        batch: &Batch,
        hidden: &Tensor,
        cache: &mut RankCache,
        comm: &mut dyn Communicator,
    ) -> Result<(Tensor, Tensor)> {
        let mtp = self.mtp_layer()?;
        let eps = self.config.rms_norm_eps as f32;
        let mut e = self.embed(batch)?;
        if batch.positions.contains(&0) {
            let keep: Vec<f32> = batch
                .positions
                .iter()
                .map(|p| f32::from(u8::from(*p != 0)))
                .collect();
            let keep = Tensor::from_vec(keep, (batch.num_tokens(), 1), &self.device)?;
            e = e.broadcast_mul(&keep)?;
        }
        let e = candle_nn::ops::rms_norm(&e.contiguous()?, &mtp.enorm, eps)?;
        let h =
            candle_nn::ops::rms_norm(&hidden.to_dtype(DType::F32)?.contiguous()?, &mtp.hnorm, eps)?;
        let eh = Tensor::cat(&[&e, &h], 1)?;
        let blocks = std::slice::from_ref(&mtp.block);
        let slots = std::slice::from_ref(&mtp.slot);
        let head = match &mtp.head {
            Some(h) => h,
            None => Self::part(&self.lm_head, "LM head")?,
        };
        let y = match cache {
            RankCache::Cpu(cache) => {
                let x = mtp.eh_proj.forward(&eh)?;
                self.blocks_cpu(blocks, slots, x, batch, cache, comm)?
            }
            #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
            RankCache::Cuda(cache) => {
                let act = crate::device::dtype::candle_dtype(crate::device::dtype::ACTIVATIONS);
                let x = mtp.eh_proj.forward_f32(&eh.to_dtype(act)?)?;
                self.blocks_cuda((blocks, slots, &[]), x, batch, cache, comm)?
            }
        };
        let logits = self.head_with(&y, batch, (&mtp.norm, head), comm)?;
        Ok((y, logits))
    }
}

/// Each rank's MTP layer (in `ranks` order, on `devices`) from layer `layer`'s tensors,
/// with its decoder `blocks` loaded as the model's layers are. The checkpoint's copy of
/// the token embedding (`embed_tokens`) is not read: the layer embeds with the model's
/// own table, as vLLM does.
pub(super) fn load(
    source: &dyn crate::loader::source::TensorSource,
    plan: &crate::tp::ShardPlan,
    (ranks, devices): (std::ops::Range<usize>, &[candle_core::Device]),
    layer: usize,
    blocks: Vec<Block>,
) -> Result<Vec<MtpLayer>> {
    use crate::loader::source::vector_of_len;
    use crate::model::linear_weight::LinearWeight;
    use crate::spec::tensor_names::layer_name;

    let config = source.config();
    let (h, vocab) = (config.hidden_size, config.vocab_size);
    let offset = f64::from(config.norm_weight_offset);
    let name = |s: &str| layer_name(layer, s);
    let norm = |s: &str| -> Result<Tensor> {
        let v = vector_of_len(source, &name(s), h)?.to_dtype(DType::F32)?;
        Ok(if offset == 0.0 { v } else { (v + offset)? })
    };
    let (enorm, hnorm, shared_norm) = (norm(ENORM)?, norm(HNORM)?, norm(SHARED_NORM)?);
    let eh_proj = source.matrix(&name(EH_PROJ))?;
    eh_proj.check_dims((h, 2 * h))?;
    let head = match source.contains(&name(SHARED_HEAD)) {
        true => {
            let m = source.matrix(&name(SHARED_HEAD))?;
            m.check_dims((vocab, h))?;
            Some(m)
        }
        false => None,
    };
    let head_split = plan.lm_head();
    let mut out = Vec::with_capacity(devices.len());
    for ((rank, dev), block) in ranks.zip(devices).zip(blocks) {
        let head_rows = head_split.rank_ranges(rank).unwrap_or_default();
        out.push(MtpLayer {
            enorm: enorm.to_device(dev)?,
            hnorm: hnorm.to_device(dev)?,
            eh_proj: Linear::new(LinearWeight::place(eh_proj.clone(), dev)?, None),
            block,
            // After the decoder layers' slots (`DecoderShard::set_kv_slots` moves it with
            // them).
            slot: LayerSlot {
                group: 0,
                slot: layer,
            },
            norm: shared_norm.to_device(dev)?,
            head: head
                .as_ref()
                .map(|m| -> Result<Linear> {
                    Ok(Linear::new(
                        LinearWeight::place(m.select_rows(&head_rows)?, dev)?,
                        None,
                    ))
                })
                .transpose()?,
        });
    }
    Ok(out)
}
