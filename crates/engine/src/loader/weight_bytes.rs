//! What a model's weights take, layer by layer, read from the file's metadata before any
//! weight is loaded: the sizes the automatic layer map (`--device-layers auto`) plans
//! with. Only the 2-D weights are counted; norms and biases are vectors of a few KiB.

use crate::error::Result;
use crate::loader::source::{lm_head_name, StoredSize, TensorSource};
use crate::spec::moe::ExpertTensor;
use crate::spec::tensor_names::layer_name;

/// One decoder layer's weights.
#[derive(Debug, Clone, Default)]
pub struct LayerWeights {
    /// Attention, the dense MLP or the router and shared expert: what stays with the
    /// layer's device.
    pub dense: Vec<StoredSize>,
    /// The routed experts: what `--cpu-moe` keeps on the host.
    pub experts: Vec<StoredSize>,
}

impl LayerWeights {
    /// Bytes of the layer's weights other than its routed experts, on a device whose
    /// dense weights take `dense_bytes` per element.
    pub fn dense_bytes(&self, dense_bytes: usize) -> usize {
        self.dense.iter().map(|s| s.bytes(dense_bytes)).sum()
    }

    /// Bytes of the routed experts.
    pub fn expert_bytes(&self, dense_bytes: usize) -> usize {
        self.experts.iter().map(|s| s.bytes(dense_bytes)).sum()
    }
}

/// Every layer's weights, and the embedding and LM head beside them.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub layers: Vec<LayerWeights>,
    pub embedding: StoredSize,
    pub head: StoredSize,
}

/// The weights of `source`'s model, layer by layer.
pub fn model_weights(source: &dyn TensorSource) -> Result<ModelWeights> {
    let config = source.config();
    let mut layers = Vec::with_capacity(config.num_layers);
    for layer in 0..config.num_layers {
        let mut w = LayerWeights::default();
        for t in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            w.dense
                .push(source.stored_size(&layer_name(layer, &format!("self_attn.{t}.weight")))?);
        }
        match &config.moe {
            Some(moe) if config.is_moe_layer(layer) => {
                let name = |t: ExpertTensor| moe.names.tensor(layer, t);
                w.dense
                    .push(source.stored_size(&name(ExpertTensor::Router))?);
                if moe.shared_intermediate_size.is_some() {
                    for t in [
                        ExpertTensor::SharedGate,
                        ExpertTensor::SharedUp,
                        ExpertTensor::SharedDown,
                    ] {
                        w.dense.push(source.stored_size(&name(t))?);
                    }
                }
                for e in 0..moe.num_experts {
                    for t in [
                        ExpertTensor::Gate(e),
                        ExpertTensor::Up(e),
                        ExpertTensor::Down(e),
                    ] {
                        w.experts.push(source.stored_size(&name(t))?);
                    }
                }
            }
            _ => {
                for t in ["gate_proj", "up_proj", "down_proj"] {
                    w.dense
                        .push(source.stored_size(&layer_name(layer, &format!("mlp.{t}.weight")))?);
                }
            }
        }
        layers.push(w);
    }
    Ok(ModelWeights {
        layers,
        embedding: source.stored_size("model.embed_tokens.weight")?,
        head: source.stored_size(lm_head_name(source))?,
    })
}
