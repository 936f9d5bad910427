//! The quantization blocks of the weights whose input dimension a tensor-parallel plan
//! splits (`o_proj`, the MLP's and every expert's `down_proj`): a split falls on whole
//! blocks, so the plan needs the largest. Read from the files' metadata alone.

use crate::error::Result;
use crate::loader::source::TensorSource;
use crate::spec::moe::{ExpertTensor, MoeConfig};
use crate::spec::tensor_names::layer_name;

/// Largest quantization block of the row-parallel weights of every layer (their input
/// dimension is split; mixed-quantization files may differ per layer). Metadata only.
pub(crate) fn row_parallel_block(source: &dyn TensorSource, num_layers: usize) -> Result<usize> {
    let mut block = 1;
    let config = source.config();
    for layer in 0..num_layers {
        block = block.max(source.block_cols(&layer_name(layer, "self_attn.o_proj.weight"))?);
        block = block.max(match &config.moe {
            Some(moe) if config.is_moe_layer(layer) => down_block(source, moe, layer)?,
            _ => source.block_cols(&layer_name(layer, "mlp.down_proj.weight"))?,
        });
    }
    Ok(block)
}

/// Largest quantization block (in columns) of the experts' down projections in layer
/// `layer` (the shared expert's too), whose input dimension is split. Metadata only.
pub(crate) fn down_block(
    source: &dyn TensorSource,
    moe: &MoeConfig,
    layer: usize,
) -> Result<usize> {
    let mut block = 1;
    let shared = moe
        .shared_intermediate_size
        .map(|_| ExpertTensor::SharedDown);
    for t in (0..moe.num_experts).map(ExpertTensor::Down).chain(shared) {
        block = block.max(source.block_cols(&moe.names.tensor(layer, t))?);
    }
    Ok(block)
}
