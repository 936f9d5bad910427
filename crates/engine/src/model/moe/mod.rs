//! The mixture-of-experts MLP (Qwen3-MoE, Mixtral, gpt-oss, GLM-4.5) as one
//! tensor-parallel shard.
//!
//! A router (mirrored on every rank: `[experts, hidden]`, small, f32 on every device)
//! scores each token; the `top_k` experts of highest softmax probability are kept, their
//! probabilities divided by their sum where the family says so (`norm_topk_prob`; Mixtral
//! always), or GLM-4.5's sigmoid router chooses them (`routing`). Each expert is a
//! SiLU-gated MLP; GLM-4.5 adds a shared expert that every token passes through.
//!
//! Split: every expert is cut along its intermediate dimension like a dense MLP (gate/up
//! column-parallel, down row-parallel), so every rank holds a slice of every expert and
//! does the same share of work whatever the router picks. A rank sums the weighted outputs
//! of its expert slices locally; the layer then needs the one all-reduce a dense MLP
//! needs (the caller's), not one per expert. Tokens are grouped by expert, so one step
//! reads each chosen expert's weights once for all its tokens.

use candle_core::{DType, Device, Tensor};

use crate::error::{EngineError, Result};
use crate::loader::matrix::Matrix;
use crate::loader::source::{vector_of_len, TensorSource};
use crate::model::cpu_ops;
use crate::model::linear::{row_parallel, ColumnParallel, Linear};
use crate::model::linear_weight::LinearWeight;
use crate::spec::model::Activation;
use crate::spec::moe::{ClampedSwiglu, ExpertTensor, MoeConfig};
use crate::tp::split::{split_units, Segment};
use crate::tp::{ShardPlan, SplitState};

use crate::model::moe::routing::Routing;

#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
mod cuda;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
mod device;
#[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
pub(crate) use device::DEVICE_ROUTED_ROWS;
pub(crate) mod routing;

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
    routing: Routing,
    experts: Vec<Expert>,
    /// GLM-4.5's shared expert: this rank's slice, weight 1 for every token.
    shared: Option<Expert>,
    hidden: usize,
    /// gpt-oss's gate in place of `SiLU(gate) · up`.
    clamped_swiglu: Option<ClampedSwiglu>,
    /// The routed experts' weights are on the host (`--cpu-moe`), run by the CPU
    /// kernels whatever the rank's device.
    #[cfg_attr(
        not(any(feature = "cuda", feature = "gpu-emulation")),
        allow(dead_code)
    )]
    host_experts: bool,
    /// The routed experts as the device kernels take them (or why they cannot take
    /// them), made when the rank's decode graphs are recorded.
    #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
    device_experts: std::sync::OnceLock<std::result::Result<Box<device::DeviceExperts>, String>>,
}

/// Each rank's intermediate columns of every routed expert, and of the shared expert
/// where there is one.
#[derive(Debug, Clone)]
pub struct ExpertRanges {
    routed: Vec<std::ops::Range<usize>>,
    shared: Option<Vec<std::ops::Range<usize>>>,
}

/// How each expert's intermediate columns are split: in proportion to the ranks' shares
/// of the dense FFN, on whole quantization blocks (`block`) of the down projections.
pub fn expert_split(moe: &MoeConfig, plan: &ShardPlan, block: usize) -> Result<ExpertRanges> {
    let ratios: Vec<f64> = plan
        .ranks
        .iter()
        .map(|r| r.ffn.len().max(1) as f64)
        .collect();
    let field = &moe.fields.intermediate_size;
    Ok(ExpertRanges {
        routed: split_units(
            moe.intermediate_size,
            &ratios,
            block,
            &format!("expert intermediate columns ({field})"),
        )?,
        shared: moe
            .shared_intermediate_size
            .map(|width| {
                split_units(
                    width,
                    &ratios,
                    block,
                    &format!("shared expert intermediate columns ({field} x n_shared_experts)"),
                )
            })
            .transpose()?,
    })
}

/// Loads the shards of layer `layer`'s mixture for ranks `first_rank..` (one per device),
/// reading each expert once. With `host_experts`, the routed experts' slices stay on the
/// host; the router and the shared expert go to each rank's device.
pub fn load_shards(
    source: &dyn TensorSource,
    moe: &MoeConfig,
    layer: usize,
    ranges: &ExpertRanges,
    first_rank: usize,
    devices: &[Device],
    host_experts: bool,
) -> Result<Vec<MoeShard>> {
    let h = source.config().hidden_size;
    let name = |t: ExpertTensor| moe.names.tensor(layer, t);
    let router = source.matrix(&name(ExpertTensor::Router))?;
    router.check_dims((moe.num_experts, h))?;
    // GLM-4.5's router chooses with its per-expert correction biases.
    let sigmoid = match moe.sigmoid_router {
        Some(router) => {
            let bias = vector_of_len(
                source,
                &name(ExpertTensor::ScoreCorrection),
                moe.num_experts,
            )?;
            Some((
                router,
                bias.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?,
            ))
        }
        None => None,
    };
    let routing = Routing::new(moe, sigmoid);
    // GLM-4.5's shared expert, split like the routed ones (its own width).
    let shared: Vec<Option<Expert>> = match (moe.shared_intermediate_size, &ranges.shared) {
        (Some(width), Some(split)) => {
            let gate_up = [
                matrix(source, &name(ExpertTensor::SharedGate), (width, h))?,
                matrix(source, &name(ExpertTensor::SharedUp), (width, h))?,
            ];
            let down = matrix(source, &name(ExpertTensor::SharedDown), (h, width))?;
            devices
                .iter()
                .enumerate()
                .map(|(i, dev)| {
                    let slice = Slice {
                        ranges: split,
                        rank: first_rank + i,
                        device: dev,
                    };
                    slice.expert(&gate_up, &down, &(None, None)).map(Some)
                })
                .collect::<Result<_>>()?
        }
        _ => devices.iter().map(|_| None).collect(),
    };
    // gpt-oss: the router's bias (mirrored like it), each expert's gate/up biases (split
    // like their rows) and down bias (added by the first rank only).
    let bias = |t: ExpertTensor, len: usize| -> Result<Option<Tensor>> {
        if !moe.biases {
            return Ok(None);
        }
        Ok(Some(vector_of_len(source, &moe.names.bias(layer, t), len)?))
    };
    let router_bias = bias(ExpertTensor::Router, moe.num_experts)?;
    let mut per_rank: Vec<Vec<Expert>> = devices.iter().map(|_| Vec::new()).collect();
    let inter = moe.intermediate_size;
    for e in 0..moe.num_experts {
        let gate_up = [
            matrix(source, &name(ExpertTensor::Gate(e)), (inter, h))?,
            matrix(source, &name(ExpertTensor::Up(e)), (inter, h))?,
        ];
        let down = matrix(source, &name(ExpertTensor::Down(e)), (h, inter))?;
        let gate_up_bias = match (
            bias(ExpertTensor::Gate(e), inter)?,
            bias(ExpertTensor::Up(e), inter)?,
        ) {
            (Some(g), Some(u)) => Some([g, u]),
            _ => None,
        };
        let biases = (gate_up_bias, bias(ExpertTensor::Down(e), h)?);
        for (i, dev) in devices.iter().enumerate() {
            let slice = Slice {
                ranges: &ranges.routed,
                rank: first_rank + i,
                device: if host_experts { &Device::Cpu } else { dev },
            };
            per_rank[i].push(slice.expert(&gate_up, &down, &biases)?);
        }
    }
    per_rank
        .into_iter()
        .zip(devices)
        .zip(shared)
        .map(|((experts, dev), shared)| {
            Ok(MoeShard {
                // The router runs in f32 on every device, its bias too.
                router: Linear::new(
                    LinearWeight::place_f32(router.clone(), dev)?,
                    router_bias
                        .as_ref()
                        .map(|b| b.to_dtype(DType::F32)?.to_device(dev))
                        .transpose()?,
                ),
                routing: routing.clone(),
                experts,
                shared,
                hidden: h,
                clamped_swiglu: moe.clamped_swiglu,
                host_experts,
                #[cfg(any(feature = "cuda", feature = "gpu-emulation"))]
                device_experts: std::sync::OnceLock::new(),
            })
        })
        .collect()
}

/// Tensor `name` of a source, checked to be `dims`.
fn matrix(source: &dyn TensorSource, name: &str, dims: (usize, usize)) -> Result<Matrix> {
    let m = source.matrix(name)?;
    m.check_dims(dims)?;
    Ok(m)
}

/// Where one rank's slice of an expert goes: its columns of each rank's `ranges`.
struct Slice<'a> {
    ranges: &'a [std::ops::Range<usize>],
    rank: usize,
    device: &'a Device,
}

impl Slice<'_> {
    /// This rank's slice of the expert whose gate and up projections are `gate_up` and
    /// whose down projection is `down`: gate/up rows and their biases split alike, the
    /// down projection's input columns split, its bias added by rank 0 only.
    fn expert(
        &self,
        gate_up: &[Matrix; 2],
        down: &Matrix,
        (gate_up_bias, down_bias): &(Option<[Tensor; 2]>, Option<Tensor>),
    ) -> Result<Expert> {
        let width = down.dims()?.1;
        let seg = Segment {
            len: width,
            ranges: self.ranges.to_vec(),
        };
        let gu_split = SplitState::Split {
            axis: 0,
            segments: vec![seg.clone(), seg],
        };
        let down_split = SplitState::split(1, width, self.ranges.to_vec());
        Ok(Expert {
            gate_up: ColumnParallel::load(
                gate_up,
                gate_up_bias.as_ref().map(|b| &b[..]),
                &gu_split,
                self.rank,
                self.device,
                "expert gate_up",
            )?,
            down: row_parallel(down, &down_split, self.rank, self.device)?
                .with_bias(down_bias.as_ref().filter(|_| self.rank == 0), self.device)?,
        })
    }
}

impl MoeShard {
    /// The tokens of each expert, from the router's logits (`[tokens, experts]`, row
    /// major): `(token, weight)` pairs in token order.
    fn groups(&self, logits: &[f32]) -> Vec<Vec<(usize, f32)>> {
        let routes = self.routing.route(logits, self.experts.len());
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
        let mut out = self.routed_on_host(&xs, &groups)?;
        // The shared expert, after the routed ones (transformers' order).
        if let Some(shared) = &self.shared {
            let act = shared.gate_up.forward_gated(x, Activation::Silu)?;
            let y = cpu_ops::with_values(&shared.down.forward(&act)?, |v| v.to_vec())?;
            for (o, v) in out.iter_mut().zip(y) {
                *o += v;
            }
        }
        Ok(Tensor::from_vec(out, (n, h), x.device())?)
    }

    /// The routed experts' weighted sum over the rows `xs` (`[tokens, hidden]`, row
    /// major) on the host, each expert once over its `groups` tokens, added per token in
    /// expert order.
    fn routed_on_host(&self, xs: &[f32], groups: &[Vec<(usize, f32)>]) -> Result<Vec<f32>> {
        let h = self.hidden;
        let mut out = vec![0f32; xs.len()];
        for (expert, group) in self.experts.iter().zip(groups) {
            if group.is_empty() {
                continue;
            }
            let mut rows = Vec::with_capacity(group.len() * h);
            for (t, _) in group {
                rows.extend_from_slice(&xs[t * h..(t + 1) * h]);
            }
            let rows = Tensor::from_vec(rows, (group.len(), h), &Device::Cpu)?;
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
        Ok(out)
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
