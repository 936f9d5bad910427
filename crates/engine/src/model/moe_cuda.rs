//! The mixture of experts on a CUDA rank. The router's logits (`[tokens, experts]`, f32)
//! come to the host, which routes as CPU ranks do; each chosen expert then runs once over
//! the rows of its tokens, gathered on the device, and its weighted output is added into
//! the rank's partial sum there.

use candle_core::{DType, Tensor};

use super::MoeShard;
use crate::config::Activation;
use crate::error::Result;
use crate::model::cuda::gated_mlp;

impl MoeShard {
    /// `h`: the normed activations `[tokens, hidden]` → this rank's partial sum of the
    /// mixture, f32 `[tokens, hidden]` (all-reduced by the caller).
    pub(crate) fn forward_cuda(&self, h: &Tensor) -> Result<Tensor> {
        let device = h.device();
        let (n, hidden) = h.dims2()?;
        let logits = self
            .router
            .forward_f32(h)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        // Every chosen expert once over its tokens' rows; their weighted outputs, in
        // expert order, go into the sum in one `index_add` (which adds the rows of one
        // index in order: the CPU's order), not one out-of-place copy per expert.
        let (mut ids, mut outputs) = (Vec::new(), Vec::new());
        for (expert, group) in self.experts.iter().zip(self.groups(&logits)) {
            if group.is_empty() {
                continue;
            }
            let tokens: Vec<u32> = group.iter().map(|(t, _)| *t as u32).collect();
            let weights: Vec<f32> = group.iter().map(|(_, w)| *w).collect();
            let idx = Tensor::from_vec(tokens.clone(), group.len(), device)?;
            let rows = h.index_select(&idx, 0)?;
            let y = gated_mlp(&expert.gate_up, &expert.down, &rows, Activation::Silu)?
                .to_dtype(DType::F32)?;
            let w = Tensor::from_vec(weights, (group.len(), 1), device)?;
            outputs.push(y.broadcast_mul(&w)?);
            ids.extend(tokens);
        }
        let out = Tensor::zeros((n, hidden), DType::F32, device)?;
        if ids.is_empty() {
            return Ok(out);
        }
        let count = ids.len();
        let out = out.index_add(
            &Tensor::from_vec(ids, count, device)?,
            &Tensor::cat(&outputs, 0)?,
            0,
        )?;
        Ok(out)
    }
}
