//! The automatic layer map (`--device-layers auto`): how many whole layers each device
//! holds, from the bytes each may use, with the layers that fit nowhere on the host,
//! last, as mistral.rs maps layers by free memory.
//!
//! Devices are filled in the order given. A device stage holds the activations of the
//! profile step, its layers' weights and their KV cache for the longest sequence; the
//! first stage also holds the token embedding, and the last the final norm, the LM head
//! and the logits. A mixture of experts first keeps the routed experts of its first
//! layers on the host (`--n-cpu-moe`), as few as make every layer fit on the devices;
//! only when even all experts on the host leave layers over do whole layers move to the
//! host. The arithmetic is plain Rust over sizes the caller measured, tested with
//! made-up models.

use std::ops::Range;

use crate::device::device_spec::DeviceSpec;
use crate::device::layer_map::{LayerMap, LayerMapEntry};
use crate::error::{EngineError, Result};

/// Bytes of one part of the model where it is placed: on a device stage and on the host
/// (dense weights take each one's compute type, the KV cache its cache type).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placed {
    pub device: usize,
    pub host: usize,
}

/// One decoder layer's bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerCost {
    /// Weights other than the routed experts.
    pub weights: Placed,
    /// The routed experts (0 in a dense layer).
    pub experts: Placed,
    /// KV cache for the sequences the map must hold.
    pub kv: Placed,
}

/// What the map is computed from.
#[derive(Debug, Clone)]
pub struct FitInput {
    pub layers: Vec<LayerCost>,
    pub embedding: Placed,
    /// Final norm and LM head.
    pub head: Placed,
    /// Activations of the largest step, on every stage.
    pub activations: usize,
    /// Logits of the largest step, on the stage that returns them.
    pub logits: usize,
    /// Each device, in order, with the bytes the map may use on it.
    pub devices: Vec<(DeviceSpec, usize)>,
    /// Bytes the host may give the model.
    pub host_budget: usize,
    /// Routed experts of layers `0..n` on the host, as asked (`--n-cpu-moe`); `None`:
    /// the map chooses.
    pub host_experts: Option<usize>,
}

/// One stage of the plan and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    pub device: DeviceSpec,
    pub layers: Range<usize>,
    /// Weights, embedding and head included.
    pub weight_bytes: usize,
    pub kv_bytes: usize,
    /// Everything the stage holds: weights, KV, activations and logits.
    pub total_bytes: usize,
}

/// The map chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitPlan {
    /// Device stages, each with at least one layer.
    pub stages: Vec<StagePlan>,
    /// The host's layers, after the devices' (`None`: every layer is on a device).
    pub host: Option<StagePlan>,
    /// Routed experts of layers `0..n` live on the host.
    pub host_expert_layers: usize,
    /// Their bytes on the host.
    pub host_expert_bytes: usize,
    /// Everything the host holds for the model (its layers, the experts, and the head
    /// when it is the last stage).
    pub host_bytes: usize,
}

impl FitPlan {
    /// The plan as a layer map over `devices` (ordinals as their specs name them).
    pub fn layer_map(&self) -> LayerMap {
        LayerMap(
            self.stages
                .iter()
                .map(|s| LayerMapEntry {
                    ordinals: vec![s.device.ordinal()],
                    layers: s.layers.len(),
                })
                .collect(),
        )
    }

    /// One line per stage for the log.
    pub fn describe(&self) -> Vec<String> {
        let mib = |b: usize| b.div_ceil(1 << 20);
        let mut lines: Vec<String> = self
            .stages
            .iter()
            .map(|s| {
                format!(
                    "{}: layers {:?}, {} MiB of weights, {} MiB of KV cache, {} MiB in all",
                    s.device,
                    s.layers,
                    mib(s.weight_bytes),
                    mib(s.kv_bytes),
                    mib(s.total_bytes)
                )
            })
            .collect();
        if let Some(h) = &self.host {
            lines.push(format!(
                "host: layers {:?}, {} MiB of weights, {} MiB of KV cache",
                h.layers,
                mib(h.weight_bytes),
                mib(h.kv_bytes)
            ));
        }
        if self.host_expert_layers > 0 {
            lines.push(format!(
                "host: the routed experts of layers 0..{} ({} MiB)",
                self.host_expert_layers,
                mib(self.host_expert_bytes)
            ));
        }
        lines
    }
}

/// Layer counts per device and the first layer left to the host, for experts of layers
/// `0..host_experts` on the host.
struct Filled {
    counts: Vec<usize>,
    first_host_layer: usize,
}

/// Device bytes of layer `l` with the experts of layers `0..host_experts` on the host.
fn device_cost(input: &FitInput, l: usize, host_experts: usize) -> usize {
    let c = &input.layers[l];
    let experts = if l < host_experts {
        0
    } else {
        c.experts.device
    };
    c.weights.device + experts + c.kv.device
}

/// Fills the devices in order, each with as many layers as it can hold; the device that
/// would hold the last layer keeps room for the head and logits, or passes its last
/// layers on.
fn fill(input: &FitInput, host_experts: usize) -> Filled {
    let total = input.layers.len();
    let mut counts = vec![0; input.devices.len()];
    let mut next = 0;
    for (d, (_, budget)) in input.devices.iter().enumerate() {
        let mut used = input.activations;
        while next < total {
            let extra = if next == 0 { input.embedding.device } else { 0 };
            let cost = device_cost(input, next, host_experts) + extra;
            if used + cost > *budget {
                break;
            }
            used += cost;
            next += 1;
            counts[d] += 1;
        }
        if next == total && counts[d] > 0 {
            while counts[d] > 0 && used + input.head.device + input.logits > *budget {
                next -= 1;
                counts[d] -= 1;
                used -= device_cost(input, next, host_experts);
                if next == 0 {
                    used -= input.embedding.device;
                }
            }
            if next == total {
                break;
            }
        }
    }
    Filled {
        counts,
        first_host_layer: next,
    }
}

/// The map for `input`, or the numbers of why the model fits nowhere.
pub fn plan(input: &FitInput) -> Result<FitPlan> {
    let total = input.layers.len();
    let has_experts = |l: usize| input.layers[l].experts.device > 0;
    // Expert counts worth trying: none, then each MoE layer's experts added in turn.
    let candidates: Vec<usize> = match input.host_experts {
        Some(n) => vec![n.min(total)],
        None => std::iter::once(0)
            .chain((0..total).filter(|l| has_experts(*l)).map(|l| l + 1))
            .collect(),
    };
    let mut chosen = None;
    for &n in &candidates {
        let filled = fill(input, n);
        let done = filled.first_host_layer == total;
        chosen = Some((n, filled));
        if done {
            break;
        }
    }
    let (host_experts, filled) = chosen.ok_or_else(|| EngineError::Config("no layers".into()))?;
    describe_plan(input, host_experts, &filled)
}

fn describe_plan(input: &FitInput, host_experts: usize, filled: &Filled) -> Result<FitPlan> {
    let total = input.layers.len();
    let mut stages = Vec::new();
    let mut start = 0;
    for ((device, _), &count) in input.devices.iter().zip(&filled.counts) {
        if count == 0 {
            continue;
        }
        let layers = start..start + count;
        let mut weights: usize = layers
            .clone()
            .map(|l| device_cost(input, l, host_experts) - input.layers[l].kv.device)
            .sum();
        let kv: usize = layers.clone().map(|l| input.layers[l].kv.device).sum();
        let mut total_bytes = input.activations;
        if start == 0 {
            weights += input.embedding.device;
        }
        if layers.end == total {
            weights += input.head.device;
            total_bytes += input.logits;
        }
        total_bytes += weights + kv;
        stages.push(StagePlan {
            device: *device,
            layers: layers.clone(),
            weight_bytes: weights,
            kv_bytes: kv,
            total_bytes,
        });
        start = layers.end;
    }
    let first_host = filled.first_host_layer;
    let host_expert_bytes: usize = (0..host_experts.min(first_host))
        .map(|l| input.layers[l].experts.host)
        .sum();
    let host = (first_host < total).then(|| {
        let layers = first_host..total;
        let mut weights: usize = layers
            .clone()
            .map(|l| input.layers[l].weights.host + input.layers[l].experts.host)
            .sum::<usize>()
            + input.head.host;
        if first_host == 0 {
            weights += input.embedding.host;
        }
        let kv: usize = layers.clone().map(|l| input.layers[l].kv.host).sum();
        StagePlan {
            device: DeviceSpec::Cpu(0),
            layers,
            weight_bytes: weights,
            kv_bytes: kv,
            total_bytes: weights + kv + input.activations + input.logits,
        }
    });
    let host_bytes = host_expert_bytes + host.as_ref().map_or(0, |h| h.total_bytes);
    if host_bytes > input.host_budget {
        let mib = |b: usize| b.div_ceil(1 << 20);
        let on_devices: usize = stages.iter().map(|s| s.total_bytes).sum();
        let layers = host.as_ref().map_or_else(
            || "no layers".to_string(),
            |h| format!("layers {:?}", h.layers),
        );
        return Err(EngineError::Config(format!(
            "the model does not fit this machine: the devices hold {} MiB ({}), and the host \
             would need {} MiB more ({layers}, {} MiB of routed experts) but has {} MiB \
             available; use a smaller or more quantized model, a shorter --max-model-len, \
             or more devices",
            mib(on_devices),
            input
                .devices
                .iter()
                .map(|(d, b)| format!("{d} may use {} MiB", b >> 20))
                .collect::<Vec<_>>()
                .join(", "),
            mib(host_bytes),
            mib(host_expert_bytes),
            input.host_budget >> 20,
        )));
    }
    Ok(FitPlan {
        stages,
        host,
        host_expert_layers: host_experts.min(first_host),
        host_expert_bytes,
        host_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// A model of `layers` dense layers of 10 MiB (20 on the host) with 1 MiB of KV each,
    /// a 5 MiB embedding and head, 2 MiB of activations and 1 of logits.
    fn dense(layers: usize, devices: &[usize]) -> FitInput {
        FitInput {
            layers: vec![
                LayerCost {
                    weights: Placed {
                        device: 10 * MIB,
                        host: 20 * MIB,
                    },
                    experts: Placed::default(),
                    kv: Placed {
                        device: MIB,
                        host: 2 * MIB,
                    },
                };
                layers
            ],
            embedding: Placed {
                device: 5 * MIB,
                host: 10 * MIB,
            },
            head: Placed {
                device: 5 * MIB,
                host: 10 * MIB,
            },
            activations: 2 * MIB,
            logits: MIB,
            devices: devices
                .iter()
                .enumerate()
                .map(|(i, m)| (DeviceSpec::Cuda(i), m * MIB))
                .collect(),
            host_budget: 1 << 40,
            host_experts: None,
        }
    }

    fn layers(got: &FitPlan) -> Vec<(DeviceSpec, Range<usize>)> {
        got.stages
            .iter()
            .chain(&got.host)
            .map(|s| (s.device, s.layers.clone()))
            .collect()
    }

    #[test]
    fn devices_fill_in_order_and_the_host_takes_the_rest() -> Result<()> {
        // cuda:0: 2 + 5 (embedding) + 3 layers of 11 = 40; a fourth would be 51.
        // cuda:1: 2 + 4 layers of 11 = 46 ≤ 50.
        let got = plan(&dense(10, &[45, 50]))?;
        assert_eq!(
            layers(&got),
            vec![
                (DeviceSpec::Cuda(0), 0..3),
                (DeviceSpec::Cuda(1), 3..7),
                (DeviceSpec::Cpu(0), 7..10),
            ]
        );
        // Host: 3 layers of 22, the head (10), activations and logits (3).
        assert_eq!(got.host_bytes, (3 * 22 + 10 + 3) * MIB);
        assert_eq!(got.stages[0].total_bytes, 40 * MIB);
        assert_eq!(got.stages[1].kv_bytes, 4 * MIB);
        Ok(())
    }

    #[test]
    fn the_last_device_keeps_room_for_the_head_or_passes_layers_on() -> Result<()> {
        // Four layers fit cuda:0 (2 + 5 + 44 = 51 ≤ 56) but not with the head and logits
        // (57): the fourth goes to cuda:1, which then holds the head.
        let got = plan(&dense(4, &[56, 30]))?;
        assert_eq!(
            layers(&got),
            vec![(DeviceSpec::Cuda(0), 0..3), (DeviceSpec::Cuda(1), 3..4)]
        );
        assert_eq!(got.stages[1].total_bytes, (2 + 11 + 5 + 1) * MIB);
        assert_eq!(got.host, None);
        // With room for the head, one device is the whole model.
        let got = plan(&dense(4, &[57, 30]))?;
        assert_eq!(layers(&got), vec![(DeviceSpec::Cuda(0), 0..4)]);
        Ok(())
    }

    #[test]
    fn a_device_too_small_for_a_layer_is_left_out() -> Result<()> {
        // cuda:0 cannot hold the embedding and a layer (18): cuda:1 is the first stage.
        let got = plan(&dense(2, &[10, 100]))?;
        assert_eq!(layers(&got), vec![(DeviceSpec::Cuda(1), 0..2)]);
        assert_eq!(got.layer_map().0.len(), 1);
        assert_eq!(got.layer_map().0[0].ordinals, vec![1]);
        Ok(())
    }

    #[test]
    fn experts_move_to_the_host_before_whole_layers() -> Result<()> {
        // Layers of 4 MiB dense weights, 20 MiB of experts and 1 MiB of KV.
        let mut input = dense(4, &[60]);
        for l in &mut input.layers {
            l.weights.device = 4 * MIB;
            l.experts = Placed {
                device: 20 * MIB,
                host: 40 * MIB,
            };
        }
        // All on the device: 2 + 5 + 4·25 + 5 + 1 = 113. Experts of layers 0..n on the
        // host save 20 each: n = 3 gives 53 ≤ 60.
        let got = plan(&input)?;
        assert_eq!(layers(&got), vec![(DeviceSpec::Cuda(0), 0..4)]);
        assert_eq!(got.host_expert_layers, 3);
        assert_eq!(got.host_expert_bytes, 120 * MIB);
        // As asked: experts of layer 0 only, and the layers that then do not fit go to
        // the host whole.
        input.host_experts = Some(1);
        let got = plan(&input)?;
        assert_eq!(got.host_expert_layers, 1);
        assert_eq!(
            layers(&got),
            vec![(DeviceSpec::Cuda(0), 0..2), (DeviceSpec::Cpu(0), 2..4)]
        );
        Ok(())
    }

    #[test]
    fn a_model_the_host_cannot_hold_is_refused_with_the_numbers() {
        let mut input = dense(10, &[45]);
        input.host_budget = 100 * MIB;
        let err = plan(&input)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        // cuda:0 holds layers 0..3 (40 MiB); the host needs 7·22 + 10 + 3 = 167 MiB.
        assert!(err.contains("the devices hold 40 MiB"), "{err}");
        assert!(err.contains("cuda:0 may use 45 MiB"), "{err}");
        assert!(
            err.contains("would need 167 MiB more (layers 3..10"),
            "{err}"
        );
        assert!(err.contains("has 100 MiB available"), "{err}");
    }
}
