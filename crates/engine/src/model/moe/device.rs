//! A mixture's routed experts on the device alone, for the steps of a few tokens that
//! decode graphs replay: the router's choice, each chosen expert's gate/up and down
//! products (through tables of the experts' weight addresses) and the weighted sum per
//! token are kernels of `kernels/cuda/moe.cu`, so nothing of the step crosses to the host
//! and the graph records the layer.
//!
//! It takes experts whose weights are dense (bf16 on a GPU, f32 where the host emulates
//! one), with one fused gate/up matrix and no biases, and routers of at most
//! [`MOE_MAX_EXPERTS`] experts; other mixtures, eager steps, and steps of more than
//! [`DEVICE_ROUTED_ROWS`] tokens take the grouped path of `cuda.rs`, whose products read
//! each chosen expert once for all its tokens.

use candle_core::{DType, Tensor};
use tessera_kernels::gpu::moe::{
    moe_combine_shape, moe_matvec_kernel, moe_matvec_shape, moe_route_shape, MoeWeight,
    MOE_COMBINE_KERNEL, MOE_MAX_EXPERTS, MOE_MAX_GROUPS, MOE_ROUTE_KERNEL,
};

use super::routing::Routing;
use super::Expert;
use crate::device::buffers::{expect_dtype, Gpu, Held, Module};
use crate::device::dtype::{candle_dtype, ACTIVATIONS};
use crate::error::{EngineError, Result};
use crate::model::cuda::kernels::{self, i32_of};
use crate::model::cuda::MlpGate;
use tessera_kernels::gpu::launch::KernelArg;

/// Most tokens of a step the device path takes (and so the rows of a mixture's decode
/// graphs): it reads an expert once per token that chose it, which pays while tokens
/// rarely share experts.
pub(crate) const DEVICE_ROUTED_ROWS: usize = 8;

/// The variable that keeps every mixture's routing on the host (`host`), to measure the
/// device path against it.
const SWITCH_VARIABLE: &str = "TESSERA_MOE_ROUTING";

/// Whether [`SWITCH_VARIABLE`] switches the device path off (read once).
fn switched_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| match std::env::var(SWITCH_VARIABLE).as_deref() {
        Ok("host") => {
            tracing::info!("{SWITCH_VARIABLE}=host: mixtures of experts route on the host");
            true
        }
        Ok(other) if !other.is_empty() => {
            tracing::warn!(
                "{SWITCH_VARIABLE}={other} is not `host`: small steps route on the device"
            );
            false
        }
        _ => false,
    })
}

/// A layer's routed experts as the device kernels read them.
#[derive(Debug)]
pub(crate) struct DeviceExperts {
    /// Each expert's fused gate/up weight address (`[2 · width, hidden]`), i64.
    gate_up: Tensor,
    /// Each expert's down weight address (`[hidden, width]`), i64.
    down: Tensor,
    /// The weights the tables point at, held for as long as the tables are.
    _weights: Vec<Tensor>,
    weight: MoeWeight,
    experts: usize,
    /// This rank's intermediate columns of an expert.
    width: usize,
    hidden: usize,
    /// The sigmoid router's correction biases on the device, f32 `[experts]`.
    bias: Option<Tensor>,
}

impl DeviceExperts {
    /// The tables of `experts` (this rank's slices, on the rank's device), or why the
    /// device path cannot take them.
    pub(crate) fn new(
        experts: &[Expert],
        routing: &Routing,
        hidden: usize,
    ) -> std::result::Result<Box<Self>, String> {
        if switched_off() {
            return Err(format!("{SWITCH_VARIABLE}=host"));
        }
        let first = experts.first().ok_or("the mixture has no experts")?;
        if experts.len() > MOE_MAX_EXPERTS {
            return Err(format!(
                "{} experts, more than the device router's {MOE_MAX_EXPERTS}",
                experts.len()
            ));
        }
        if routing.top_k == 0 || routing.top_k > experts.len() {
            return Err(format!(
                "top-k {} of {} experts",
                routing.top_k,
                experts.len()
            ));
        }
        if let Some((router, _)) = &routing.sigmoid {
            if router.groups == 0
                || router.groups > MOE_MAX_GROUPS
                || !experts.len().is_multiple_of(router.groups)
                || router.top_groups > router.groups
                || router.top_groups * (experts.len() / router.groups) < routing.top_k
            {
                return Err(format!(
                    "{} groups of experts, {} chosen",
                    router.groups, router.top_groups
                ));
            }
        }
        let width = first.gate_up.widths().first().copied().unwrap_or(0);
        let mut weights = Vec::with_capacity(2 * experts.len());
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let mut dtype = None;
        for e in experts {
            let (Some(gu), Some(d)) = (e.gate_up.fused_dense_weight(), e.down.dense_weight())
            else {
                return Err("the experts' weights are quantized, biased or not fused".into());
            };
            let shapes_fit = gu.dims2().ok() == Some((2 * width, hidden))
                && d.dims2().ok() == Some((hidden, width))
                && e.gate_up.widths().iter().all(|w| *w == width)
                && gu.is_contiguous()
                && d.is_contiguous();
            if !shapes_fit
                || gu.dtype() != d.dtype()
                || *dtype.get_or_insert(gu.dtype()) != gu.dtype()
            {
                return Err("the experts' weights differ in shape or type".into());
            }
            gate_up.push(address(gu)?);
            down.push(address(d)?);
            weights.extend([gu.clone(), d.clone()]);
        }
        let weight = match dtype {
            Some(DType::BF16) => MoeWeight::Bf16,
            Some(DType::F16) => MoeWeight::F16,
            Some(DType::F32) => MoeWeight::F32,
            other => return Err(format!("experts' weights in {other:?}")),
        };
        if moe_matvec_kernel(weight, ACTIVATIONS, false).is_none() {
            return Err(format!("experts' weights in {dtype:?}"));
        }
        let device = weights
            .first()
            .ok_or("the mixture has no experts")?
            .device();
        let table = |v: Vec<i64>| Tensor::from_vec(v, experts.len(), device);
        let bias = match &routing.sigmoid {
            Some((_, b)) => Some(Tensor::new(b.as_slice(), device).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Box::new(Self {
            gate_up: table(gate_up).map_err(|e| e.to_string())?,
            down: table(down).map_err(|e| e.to_string())?,
            _weights: weights,
            weight,
            experts: experts.len(),
            width,
            hidden,
            bias,
        }))
    }

    /// The routed experts' weighted sum for `h` (`[tokens, hidden]`, the activation type)
    /// from the router's `logits` (f32 `[tokens, experts]`): f32 `[tokens, hidden]`.
    pub(crate) fn forward(
        &self,
        h: &Tensor,
        logits: &Tensor,
        routing: &Routing,
        gate: MlpGate,
    ) -> Result<Tensor> {
        let gpu = Gpu::of(h.device())?;
        let (tokens, hidden) = h.dims2()?;
        let k = routing.top_k;
        if hidden != self.hidden || logits.dims2()? != (tokens, self.experts) {
            return Err(EngineError::Step(format!(
                "device experts: activations {:?} and logits {:?} for {} experts of width {}",
                h.dims(),
                logits.dims(),
                self.experts,
                self.hidden
            )));
        }
        let logits = logits.contiguous()?;
        let h = h.to_dtype(candle_dtype(ACTIVATIONS))?.contiguous()?;
        let (ids, weights) = route(gpu, &logits, routing, self.bias.as_ref())?;
        let slots = tokens * k;
        let gate_up = gpu.output(h.dtype(), (slots, 2 * self.width))?;
        self.matvec(gpu, (&gate_up, false), &self.gate_up, &ids, &h, k, false)?;
        let act = kernels::gated_mul(gpu, ACTIVATIONS, &gate_up, self.width, gate)?;
        let y = gpu.output(DType::F32, (slots, self.hidden))?;
        self.matvec(gpu, (&y, true), &self.down, &ids, &act, k, true)?;
        let out = gpu.output(DType::F32, (tokens, self.hidden))?;
        let total = tokens * self.hidden;
        if total > 0 {
            let held = [
                Held::new(&out, "expert sum")?,
                Held::new(&y, "expert outputs")?,
                Held::new(&ids, "expert ids")?,
                Held::new(&weights, "expert weights")?,
            ];
            let args = [
                held[0].arg()?,
                held[1].arg()?,
                held[2].arg()?,
                held[3].arg()?,
                i32_of(tokens, "tokens")?,
                i32_of(k, "top-k")?,
                i32_of(self.hidden, "hidden size")?,
            ];
            // SAFETY: matches moe.cu's moe_combine_f32: `out` [tokens, hidden], `y`
            // [tokens · k, hidden], `ids` and `weights` [tokens, k].
            unsafe {
                gpu.launch(
                    Module::Moe,
                    MOE_COMBINE_KERNEL,
                    moe_combine_shape(total),
                    &args,
                )
            }?;
        }
        Ok(out)
    }

    /// `out` (`[tokens · k, rows]`, f32 if `f32_out`) = each slot's expert of `table`
    /// times `x`: the token's row of `x`, or the slot's own (`per_slot`).
    #[allow(clippy::too_many_arguments)]
    fn matvec(
        &self,
        gpu: Gpu<'_>,
        (out, f32_out): (&Tensor, bool),
        table: &Tensor,
        ids: &Tensor,
        x: &Tensor,
        k: usize,
        per_slot: bool,
    ) -> Result<()> {
        let (slots, rows) = out.dims2()?;
        let cols = x.dim(1)?;
        if slots == 0 || rows == 0 {
            return Ok(());
        }
        let name = moe_matvec_kernel(self.weight, ACTIVATIONS, f32_out).ok_or_else(|| {
            EngineError::Step(format!("no expert matvec for {:?} weights", self.weight))
        })?;
        let held = [
            Held::new(out, "expert products")?,
            Held::new(table, "expert weight table")?,
            Held::new(ids, "expert ids")?,
            Held::new(x, "expert inputs")?,
        ];
        let args = [
            held[0].arg()?,
            held[1].arg()?,
            held[2].arg()?,
            held[3].arg()?,
            i32_of(rows, "expert rows")?,
            i32_of(cols, "expert columns")?,
            i32_of(k, "top-k")?,
            KernelArg::I32(i32::from(per_slot)),
        ];
        // SAFETY: matches moe.cu's moe_matvec; every table entry is the address of a live
        // `[rows, cols]` weight (held by `self`), `ids` holds expert indices below the
        // table's length (the router's), `x` has a row per token (per slot if
        // `per_slot`) of `cols` values, `out` `[slots, rows]`.
        unsafe { gpu.launch(Module::Moe, &name, moe_matvec_shape(rows, slots), &args) }
    }
}

/// Each token's experts and their weights (`[tokens, top_k]`, u32 and f32, best first)
/// from the router's f32 `logits` (`[tokens, experts]`), as `routing` chooses them;
/// `bias`: the sigmoid router's correction biases on the device.
fn route(
    gpu: Gpu<'_>,
    logits: &Tensor,
    routing: &Routing,
    bias: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let (tokens, experts) = logits.dims2()?;
    expect_dtype(logits, DType::F32, "router logits")?;
    let k = routing.top_k;
    let ids = gpu.output(DType::U32, (tokens, k))?;
    let weights = gpu.output(DType::F32, (tokens, k))?;
    if tokens == 0 {
        return Ok((ids, weights));
    }
    if experts > MOE_MAX_EXPERTS
        || k == 0
        || k > experts
        || bias.is_some() != routing.sigmoid.is_some()
    {
        return Err(EngineError::Step(format!(
            "device router: top-{k} of {experts} experts"
        )));
    }
    let held = [
        Held::new(&ids, "expert ids")?,
        Held::new(&weights, "expert weights")?,
        Held::new(logits, "router logits")?,
    ];
    let bias = bias.map(|b| Held::new(b, "router biases")).transpose()?;
    let (groups, top_groups, scale) = routing
        .sigmoid
        .as_ref()
        .map_or((1, 1, 1.0), |(r, _)| (r.groups, r.top_groups, r.scale));
    let args = [
        held[0].arg()?,
        held[1].arg()?,
        held[2].arg()?,
        i32_of(experts, "experts")?,
        i32_of(k, "top-k")?,
        KernelArg::I32(i32::from(routing.norm)),
        // A null pointer: the softmax router.
        bias.as_ref()
            .map(Held::arg)
            .transpose()?
            .unwrap_or(KernelArg::Ptr(0)),
        i32_of(groups, "expert groups")?,
        i32_of(top_groups, "chosen groups")?,
        KernelArg::F32(scale),
    ];
    // SAFETY: matches moe.cu's moe_route_f32; `logits` [tokens, experts] (at most
    // MOE_MAX_EXPERTS, checked above), `ids` and `weights` [tokens, k], the biases
    // [experts].
    unsafe {
        gpu.launch(
            Module::Moe,
            MOE_ROUTE_KERNEL,
            moe_route_shape(tokens),
            &args,
        )
    }?;
    drop((held, bias));
    Ok((ids, weights))
}

/// The address of `t`'s first element, as a table entry.
fn address(t: &Tensor) -> std::result::Result<i64, String> {
    let held = Held::new(t, "expert weight").map_err(|e| e.to_string())?;
    let a = held.address().map_err(|e| e.to_string())?;
    i64::try_from(a).map_err(|_| format!("address {a:#x} does not fit a table entry"))
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};
    use tessera_kernels::gpu::reference::Lcg;

    use super::{route, Gpu, Routing};
    use crate::spec::moe::SigmoidRouter;

    /// The device router's experts and weights for `logits` against the host's.
    fn check(routing: &Routing, logits: &[f32], experts: usize) {
        let tokens = logits.len() / experts;
        let dev = Device::Cpu;
        let gpu = Gpu::of(&dev).expect("emulated GPU");
        let t = Tensor::from_slice(logits, (tokens, experts), &dev).expect("logits");
        let bias = routing
            .sigmoid
            .as_ref()
            .map(|(_, b)| Tensor::new(b.as_slice(), &dev).expect("bias"));
        let (ids, weights) = route(gpu, &t, routing, bias.as_ref()).expect("route");
        let ids = ids.to_vec2::<u32>().expect("ids");
        let weights = weights.to_vec2::<f32>().expect("weights");
        let want = routing.route(logits, experts);
        for (t, want) in want.iter().enumerate() {
            let got: Vec<usize> = ids[t].iter().map(|e| *e as usize).collect();
            let want_ids: Vec<usize> = want.iter().map(|(e, _)| *e).collect();
            assert_eq!(got, want_ids, "token {t}");
            for (j, (_, w)) in want.iter().enumerate() {
                let d = (weights[t][j] - w).abs();
                assert!(
                    d <= 1e-5 * w.abs().max(1.0),
                    "token {t} slot {j}: {} against {w}",
                    weights[t][j]
                );
            }
        }
    }

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Lcg(seed);
        (0..n)
            .map(|_| rng.below(2000) as f32 / 250.0 - 4.0)
            .collect()
    }

    #[test]
    fn the_device_router_chooses_as_the_host() {
        // Softmax, with and without renormalising, over 40 experts (more than a warp's
        // lanes), and rows of ties (equal logits: the lower index wins).
        let experts = 40;
        let mut logits = random(6 * experts, 3);
        logits.extend(std::iter::repeat_n(0.5, experts));
        logits.extend((0..experts).map(|e| if e % 7 == 3 { 2.0 } else { -1.0 }));
        for norm in [true, false] {
            for top_k in [1, 4, 8] {
                let routing = Routing {
                    top_k,
                    norm,
                    sigmoid: None,
                };
                check(&routing, &logits, experts);
            }
        }
        // GLM-4.5's sigmoid router: 8 groups of 8, the best 3 groups, scaled.
        let experts = 64;
        let logits = random(5 * experts, 5);
        let bias: Vec<f32> = random(experts, 11).iter().map(|b| b / 8.0).collect();
        for (groups, top_groups) in [(8, 3), (1, 1), (64, 64)] {
            for norm in [true, false] {
                let routing = Routing {
                    top_k: 6,
                    norm,
                    sigmoid: Some((
                        SigmoidRouter {
                            groups,
                            top_groups,
                            scale: 2.5,
                        },
                        bias.clone(),
                    )),
                };
                check(&routing, &logits, experts);
            }
        }
    }
}
