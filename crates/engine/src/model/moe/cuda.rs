//! The mixture of experts on a CUDA rank. A decode graph's step (a few tokens) runs on
//! the device alone where the experts allow it (`device.rs`): routing, products and the
//! weighted sum are kernels, which the graph records. Otherwise the router's logits
//! (`[tokens, experts]`, f32) come to the host, which routes as CPU ranks do; each chosen
//! expert then runs once over the rows of its tokens, gathered on the device, and each
//! token's weighted outputs are added there in expert order (the CPU's order), then the
//! shared expert's output where the family has one. Experts kept on the host
//! (`--cpu-moe`) run there instead, on the hidden states copied over once per layer, while
//! the device runs the shared expert.

use candle_core::{DType, Device, Tensor};

use super::device::{DeviceExperts, DEVICE_ROUTED_ROWS};
use super::MoeShard;
use crate::error::Result;
use crate::model::cuda::gated_mlp;
use crate::model::cuda::MlpGate;
use crate::spec::model::Activation;

impl MoeShard {
    /// `h`: the normed activations `[tokens, hidden]` → this rank's partial sum of the
    /// mixture, f32 `[tokens, hidden]` (all-reduced by the caller). `on_device`: route
    /// on the device where the experts allow it (a decode graph's step).
    pub(crate) fn forward_cuda(&self, h: &Tensor, on_device: bool) -> Result<Tensor> {
        let device = h.device();
        let (n, hidden) = h.dims2()?;
        let logits = self.router.forward_f32(h)?.to_dtype(DType::F32)?;
        let gate = self
            .clamped_swiglu
            .map_or(MlpGate::Plain(Activation::Silu), MlpGate::Clamped);
        // GLM-4.5's shared expert over every row, added after the routed experts; queued
        // first, so the device runs it while the host runs experts it holds.
        let shared = match &self.shared {
            Some(s) => Some(
                gated_mlp(&s.gate_up, &s.down, h, MlpGate::Plain(Activation::Silu))?
                    .to_dtype(DType::F32)?,
            ),
            None => None,
        };
        let with_shared = |routed: Tensor| -> Result<Tensor> {
            Ok(match &shared {
                Some(s) => (routed + s)?,
                None => routed,
            })
        };
        if on_device && n <= DEVICE_ROUTED_ROWS && !self.host_experts {
            if let Ok(experts) = self.device_experts() {
                return with_shared(experts.forward(h, &logits, &self.routing, gate)?);
            }
        }
        let logits = logits.flatten_all()?.to_vec1::<f32>()?;
        let groups = self.groups(&logits);
        if self.host_experts {
            // The hidden states cross to the host once, the experts' sum comes back once.
            let xs = h
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_device(&Device::Cpu)?
                .to_vec1::<f32>()?;
            let routed = self.routed_on_host(&xs, &groups)?;
            let routed = Tensor::from_vec(routed, (n, hidden), &Device::Cpu)?.to_device(device)?;
            return with_shared(routed);
        }
        // Every chosen expert once over its tokens' rows; their weighted outputs, in
        // expert order, are then summed per token.
        let (mut ids, mut outputs) = (Vec::new(), Vec::new());
        for (expert, group) in self.experts.iter().zip(groups) {
            if group.is_empty() {
                continue;
            }
            let tokens: Vec<u32> = group.iter().map(|(t, _)| *t as u32).collect();
            let weights: Vec<f32> = group.iter().map(|(_, w)| *w).collect();
            let idx = Tensor::from_vec(tokens.clone(), group.len(), device)?;
            let rows = h.index_select(&idx, 0)?;
            let y = gated_mlp(&expert.gate_up, &expert.down, &rows, gate)?.to_dtype(DType::F32)?;
            let w = Tensor::from_vec(weights, (group.len(), 1), device)?;
            outputs.push(y.broadcast_mul(&w)?);
            ids.extend(tokens);
        }
        if ids.is_empty() {
            return with_shared(Tensor::zeros((n, hidden), DType::F32, device)?);
        }
        // Slot j of every token: its j-th output row (expert order), or a zero row. One
        // gather, then the slots added one after another: the CPU's order, and parallel
        // over every element (candle's `index_add` loops over all the ids in each of only
        // `hidden` threads, which a long prefill's tokens × experts makes slow).
        let slots = token_slots(&ids, n);
        let all = Tensor::cat(
            &[
                Tensor::cat(&outputs, 0)?,
                Tensor::zeros((1, hidden), DType::F32, device)?,
            ],
            0,
        )?;
        let depth = slots.len() / n.max(1);
        let gathered = all.index_select(&Tensor::from_vec(slots, depth * n, device)?, 0)?;
        let mut out = gathered.narrow(0, 0, n)?;
        for j in 1..depth {
            out = (out + gathered.narrow(0, j * n, n)?)?;
        }
        with_shared(out)
    }
}

/// For output rows owned by tokens `ids` (row `p` belongs to token `ids[p]`, each token's
/// rows in the order they should be added), slot-major row indices: entry `j · tokens + t`
/// is token `t`'s `j`-th row, or `ids.len()` (a zero row) past its last. At least one
/// slot.
fn token_slots(ids: &[u32], tokens: usize) -> Vec<u32> {
    let zero = ids.len() as u32;
    let mut seen = vec![0usize; tokens];
    let mut slots: Vec<u32> = vec![zero; tokens];
    for (p, &t) in ids.iter().enumerate() {
        let Some(j) = seen.get_mut(t as usize) else {
            continue;
        };
        if (*j + 1) * tokens > slots.len() {
            slots.resize((*j + 1) * tokens, zero);
        }
        slots[*j * tokens + t as usize] = p as u32;
        *j += 1;
    }
    slots
}

impl MoeShard {
    /// The routed experts as the device kernels take them, made on first use; or why
    /// they cannot take them.
    fn device_experts(&self) -> std::result::Result<&DeviceExperts, &str> {
        self.device_experts
            .get_or_init(|| DeviceExperts::new(&self.experts, &self.routing, self.hidden))
            .as_deref()
            .map_err(String::as_str)
    }

    /// Why a decode graph cannot record this layer's step, if it cannot: its experts must
    /// run on the device alone.
    pub(crate) fn graph_refusal(&self) -> Option<String> {
        if self.host_experts {
            return Some("the mixture's experts run on the host".into());
        }
        self.device_experts()
            .err()
            .map(|why| format!("the mixture's experts cannot run on the device alone: {why}"))
    }
}

#[cfg(test)]
mod tests {
    use super::token_slots;

    #[test]
    fn each_token_takes_its_rows_in_order_then_the_zero_row() {
        // Rows of tokens 2, 0, 2, 1, 2 (three experts' groups); token 1 has one row.
        let slots = token_slots(&[2, 0, 2, 1, 2], 3);
        assert_eq!(slots, vec![1, 3, 0, 5, 5, 2, 5, 5, 4]);
        assert_eq!(token_slots(&[], 2), vec![0, 0]);
    }
}
