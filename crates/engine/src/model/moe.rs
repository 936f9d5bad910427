//! The mixture-of-experts MLP (Qwen3-MoE, Mixtral) as one tensor-parallel shard.
//!
//! A router (mirrored on every rank: `[experts, hidden]`, small, f32 on every device)
//! scores each token; the `top_k` experts of highest softmax probability are kept, their
//! probabilities divided by their sum where the family says so (`norm_topk_prob`; Mixtral
//! always). Each expert is a SiLU-gated MLP.
//!
//! Split: every expert is cut along its intermediate dimension like a dense MLP (gate/up
//! column-parallel, down row-parallel), so every rank holds a slice of every expert and
//! does the same share of work whatever the router picks. A rank sums the weighted outputs
//! of its expert slices locally; the layer then needs the one all-reduce a dense MLP
//! needs (the caller's), not one per expert. Tokens are grouped by expert, so one step
//! reads each chosen expert's weights once for all its tokens.

use candle_core::{Device, Tensor};

use crate::config::{Activation, ClampedSwiglu, ExpertTensor, MoeConfig};
use crate::error::{EngineError, Result};
use crate::loader::{vector_of_len, Matrix, TensorSource};
use crate::model::cpu_ops;
use crate::model::linear::{row_parallel, ColumnParallel, Linear};
use crate::tp::split::{split_units, Segment};
use crate::tp::{ShardPlan, SplitState};

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
#[path = "moe_cuda.rs"]
mod cuda;

/// One rank's slice of one expert.
#[derive(Debug)]
struct Expert {
    gate_up: ColumnParallel,
    down: Linear,
}

/// One rank's part of a mixture-of-experts MLP.
#[derive(Debug)]
pub struct MoeShard {
    router: Linear,
    experts: Vec<Expert>,
    top_k: usize,
    norm_topk_prob: bool,
    hidden: usize,
    /// gpt-oss's gate in place of `SiLU(gate) · up`.
    clamped_swiglu: Option<ClampedSwiglu>,
}

/// Largest quantization block (in columns) of the experts' down projections in layer
/// `layer`, whose input dimension is split. Metadata only.
pub fn down_block(source: &dyn TensorSource, moe: &MoeConfig, layer: usize) -> Result<usize> {
    let mut block = 1;
    for e in 0..moe.num_experts {
        let name = moe.names.tensor(layer, ExpertTensor::Down(e));
        block = block.max(source.block_cols(&name)?);
    }
    Ok(block)
}

/// How each expert's intermediate columns are split: in proportion to the ranks' shares
/// of the dense FFN, on whole quantization blocks (`block`) of the down projections.
pub fn expert_split(
    moe: &MoeConfig,
    plan: &ShardPlan,
    block: usize,
) -> Result<Vec<std::ops::Range<usize>>> {
    let ratios: Vec<f64> = plan
        .ranks
        .iter()
        .map(|r| r.ffn.len().max(1) as f64)
        .collect();
    split_units(
        moe.intermediate_size,
        &ratios,
        block,
        &format!(
            "expert intermediate columns ({})",
            moe.fields.intermediate_size
        ),
    )
}

/// Loads the shards of layer `layer`'s mixture for ranks `first_rank..` (one per device),
/// reading each expert once.
pub fn load_shards(
    source: &dyn TensorSource,
    moe: &MoeConfig,
    layer: usize,
    ranges: &[std::ops::Range<usize>],
    first_rank: usize,
    devices: &[Device],
) -> Result<Vec<MoeShard>> {
    let h = source.config().hidden_size;
    let name = |t: ExpertTensor| moe.names.tensor(layer, t);
    let router = source.matrix(&name(ExpertTensor::Router))?;
    router.check_dims((moe.num_experts, h))?;
    // gpt-oss: the router's bias (mirrored like it), each expert's gate/up biases (split
    // like their rows) and down bias (added by the first rank only).
    let bias = |t: ExpertTensor, len: usize| -> Result<Option<Tensor>> {
        if !moe.biases {
            return Ok(None);
        }
        Ok(Some(vector_of_len(source, &moe.names.bias(layer, t), len)?))
    };
    let router_bias = bias(ExpertTensor::Router, moe.num_experts)?;
    let seg = Segment {
        len: moe.intermediate_size,
        ranges: ranges.to_vec(),
    };
    let gu_split = SplitState::Split {
        axis: 0,
        segments: vec![seg.clone(), seg],
    };
    let down_split = SplitState::split(1, moe.intermediate_size, ranges.to_vec());
    let mut per_rank: Vec<Vec<Expert>> = devices.iter().map(|_| Vec::new()).collect();
    for e in 0..moe.num_experts {
        let mat = |t: ExpertTensor, dims: (usize, usize)| -> Result<Matrix> {
            let m = source.matrix(&name(t))?;
            m.check_dims(dims)?;
            Ok(m)
        };
        let inter = moe.intermediate_size;
        let gate_up = [
            mat(ExpertTensor::Gate(e), (inter, h))?,
            mat(ExpertTensor::Up(e), (inter, h))?,
        ];
        let down = mat(ExpertTensor::Down(e), (h, inter))?;
        let gate_up_bias = match (
            bias(ExpertTensor::Gate(e), inter)?,
            bias(ExpertTensor::Up(e), inter)?,
        ) {
            (Some(g), Some(u)) => Some([g, u]),
            _ => None,
        };
        let down_bias = bias(ExpertTensor::Down(e), h)?;
        for (i, dev) in devices.iter().enumerate() {
            let rank = first_rank + i;
            per_rank[i].push(Expert {
                gate_up: ColumnParallel::load(
                    &gate_up,
                    gate_up_bias.as_ref().map(|b| &b[..]),
                    &gu_split,
                    rank,
                    dev,
                    "expert gate_up",
                )?,
                down: row_parallel(&down, &down_split, rank, dev)?
                    .with_bias(down_bias.as_ref().filter(|_| rank == 0), dev)?,
            });
        }
    }
    per_rank
        .into_iter()
        .zip(devices)
        .map(|(experts, dev)| {
            Ok(MoeShard {
                router: Linear::new(router.clone().into_f32_linear_weight(dev)?, None)
                    .with_bias(router_bias.as_ref(), dev)?,
                experts,
                top_k: moe.top_k,
                norm_topk_prob: moe.norm_topk_prob,
                hidden: h,
                clamped_swiglu: moe.clamped_swiglu,
            })
        })
        .collect()
}

/// Per token, the chosen experts and their weights: softmax over the router's logits,
/// the `k` most probable (ties to the lower index), renormalised to sum 1 if `norm`.
pub fn route(logits: &[f32], experts: usize, k: usize, norm: bool) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks_exact(experts.max(1))
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f32 = exp.iter().sum();
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|a, b| exp[*b].total_cmp(&exp[*a]).then(a.cmp(b)));
            let mut chosen: Vec<(usize, f32)> = order
                .into_iter()
                .take(k)
                .map(|e| (e, exp[e] / sum))
                .collect();
            if norm {
                let total: f32 = chosen.iter().map(|(_, p)| p).sum();
                chosen.iter_mut().for_each(|(_, p)| *p /= total);
            }
            chosen
        })
        .collect()
}

impl MoeShard {
    /// The tokens of each expert, from the router's logits (`[tokens, experts]`, row
    /// major): `(token, weight)` pairs in token order.
    fn groups(&self, logits: &[f32]) -> Vec<Vec<(usize, f32)>> {
        let routes = route(logits, self.experts.len(), self.top_k, self.norm_topk_prob);
        let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.experts.len()];
        for (t, chosen) in routes.iter().enumerate() {
            for &(e, w) in chosen {
                groups[e].push((t, w));
            }
        }
        groups
    }

    /// `x`: `[tokens, hidden]` → this rank's partial sum of the mixture, `[tokens, hidden]`
    /// (all-reduced by the caller).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, h) = x.dims2()?;
        if h != self.hidden {
            return Err(EngineError::Parallel(format!(
                "mixture of experts: input width {h}, expected {}",
                self.hidden
            )));
        }
        let logits = cpu_ops::with_values(&self.router.forward(x)?, |v| v.to_vec())?;
        let groups = self.groups(&logits);
        let xs = cpu_ops::with_values(x, |v| v.to_vec())?;
        let mut out = vec![0f32; n * h];
        for (expert, group) in self.experts.iter().zip(&groups) {
            if group.is_empty() {
                continue;
            }
            let mut rows = Vec::with_capacity(group.len() * h);
            for (t, _) in group {
                rows.extend_from_slice(&xs[t * h..(t + 1) * h]);
            }
            let rows = Tensor::from_vec(rows, (group.len(), h), x.device())?;
            let act = match self.clamped_swiglu {
                Some(c) => match expert.gate_up.forward(&rows)?.as_slice() {
                    [gate, up] => clamped_swiglu(gate, up, c)?,
                    _ => return Err(EngineError::Parallel("expert gate/up: two parts".into())),
                },
                None => expert.gate_up.forward_gated(&rows, Activation::Silu)?,
            };
            let y = cpu_ops::with_values(&expert.down.forward(&act)?, |v| v.to_vec())?;
            for ((t, w), y) in group.iter().zip(y.chunks_exact(h)) {
                for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(y) {
                    *o += w * v;
                }
            }
        }
        Ok(Tensor::from_vec(out, (n, h), x.device())?)
    }
}

/// gpt-oss's gate, `(clamp(up, ±limit) + 1) · g·σ(alpha·g)` with `g = min(gate, limit)`,
/// element by element over `[tokens, width]`.
fn clamped_swiglu(gate: &Tensor, up: &Tensor, c: ClampedSwiglu) -> Result<Tensor> {
    let up_values = cpu_ops::with_values(up, |v| v.to_vec())?;
    let out = cpu_ops::with_values(gate, |g| {
        g.iter()
            .zip(&up_values)
            .map(|(&g, &u)| {
                let g = g.min(c.limit);
                let u = u.clamp(-c.limit, c.limit);
                (u + 1.0) * g / (1.0 + (-c.alpha * g).exp())
            })
            .collect::<Vec<f32>>()
    })?;
    Ok(Tensor::from_vec(out, gate.dims2()?, gate.device())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keeps_the_top_k_and_renormalises() {
        // Logits of 4 experts: softmax order 2, 0, 3, 1.
        let logits = [1.0f32, -1.0, 2.0, 0.5];
        let r = route(&logits, 4, 2, false);
        let e: Vec<f32> = logits.iter().map(|v| v.exp()).collect();
        let total: f32 = e.iter().sum();
        assert_eq!(r[0][0].0, 2);
        assert_eq!(r[0][1].0, 0);
        assert!((r[0][0].1 - e[2] / total).abs() < 1e-6);
        let r = route(&logits, 4, 2, true);
        assert!((r[0][0].1 - e[2] / (e[2] + e[0])).abs() < 1e-6);
        assert!((r[0][0].1 + r[0][1].1 - 1.0).abs() < 1e-6);
        // Equal logits: the lower index wins.
        let r = route(&[0.0, 0.0, 0.0], 3, 1, true);
        assert_eq!(r[0], vec![(0, 1.0)]);
    }

    #[test]
    fn clamped_swiglu_clamps_the_gate_above_and_up_both_ways() -> Result<()> {
        let c = ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        };
        let dev = Device::Cpu;
        let gate = Tensor::new(&[[-2.0f32, 0.5, 9.0, 3.0]], &dev)?;
        let up = Tensor::new(&[[1.0f32, -8.0, 0.0, 20.0]], &dev)?;
        let got = clamped_swiglu(&gate, &up, c)?.to_vec2::<f32>()?;
        let glu = |g: f32| g / (1.0 + (-1.702 * g).exp());
        let want = [2.0 * glu(-2.0), -6.0 * glu(0.5), glu(7.0), 8.0 * glu(3.0)];
        for (a, b) in got[0].iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        Ok(())
    }
}
