//! Layer maps: pipeline placement of whole decoder layers on devices.
//!
//! `"0:16;1:14"` puts the first 16 layers on device ordinal 0 and the next 14 on ordinal
//! 1 (ordinals of the `--devices` list); layers left over run on the host CPU, last. Each
//! device is one pipeline stage; activations travel from stage to stage.
//!
//! `"0,1:16;2,3:14"` makes each stage a tensor-parallel group: layers 0..16 split over
//! devices 0 and 1, the rest over 2 and 3. Every stage has as many devices; the host's
//! stage, where layers are left over, has as many CPU ranks.

use std::ops::Range;

use crate::device::device_spec::DeviceSpec;
use crate::error::{EngineError, Result};

/// One `ordinals:layers` entry of a layer map: a stage's devices (one, or a
/// tensor-parallel group) and how many layers it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerMapEntry {
    pub ordinals: Vec<usize>,
    pub layers: usize,
}

/// `--device-layers`: a map as written, or `auto` (fitted to each device's memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceLayers {
    Auto,
    Map(LayerMap),
}

impl std::str::FromStr for DeviceLayers {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" => Ok(DeviceLayers::Auto),
            map => Ok(DeviceLayers::Map(map.parse()?)),
        }
    }
}

impl From<LayerMap> for DeviceLayers {
    fn from(map: LayerMap) -> Self {
        DeviceLayers::Map(map)
    }
}

/// A parsed `--device-layers` map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerMap(pub Vec<LayerMapEntry>);

/// Layers run by one pipeline stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The stage's devices: its tensor-parallel ranks, in rank order.
    pub devices: Vec<DeviceSpec>,
    pub layers: Range<usize>,
    /// The host stage that takes the layers the map leaves over.
    pub host: bool,
}

fn bad(msg: String) -> EngineError {
    EngineError::Parallel(format!("--device-layers: {msg}"))
}

impl std::str::FromStr for LayerMap {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        let mut entries: Vec<LayerMapEntry> = Vec::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (ord, layers) = part.split_once(':').ok_or_else(|| {
                bad(format!(
                    "'{part}' is not ORDINAL:LAYERS, as in \"0:16;1:14\""
                ))
            })?;
            let ordinals = ord
                .split(',')
                .map(|o| {
                    o.trim()
                        .parse()
                        .map_err(|_| bad(format!("'{o}' in '{part}' is not a device ordinal")))
                })
                .collect::<Result<Vec<usize>>>()?;
            let layers: usize = layers
                .trim()
                .parse()
                .map_err(|_| bad(format!("'{layers}' in '{part}' is not a layer count")))?;
            if layers == 0 {
                return Err(bad(format!(
                    "'{part}' gives a device no layers; leave it out"
                )));
            }
            for o in &ordinals {
                let seen = entries.iter().flat_map(|e| &e.ordinals).chain(&ordinals);
                if seen.filter(|x| *x == o).count() > 1 {
                    return Err(bad(format!(
                        "ordinal {o} appears twice; give each device to one stage"
                    )));
                }
            }
            if let Some(first) = entries
                .first()
                .filter(|f| f.ordinals.len() != ordinals.len())
            {
                return Err(bad(format!(
                    "every stage is a tensor-parallel group of as many devices: the first \
                     has {}, '{part}' has {}",
                    first.ordinals.len(),
                    ordinals.len()
                )));
            }
            entries.push(LayerMapEntry { ordinals, layers });
        }
        if entries.is_empty() {
            return Err(bad(
                "empty map; write e.g. \"0:16;1:14\", or \"auto\" to fit the devices' memory"
                    .into(),
            ));
        }
        Ok(LayerMap(entries))
    }
}

impl LayerMap {
    /// The stages for a model of `num_layers` over `devices` (whose ordinals the map names).
    pub fn stages(&self, devices: &[DeviceSpec], num_layers: usize) -> Result<Vec<Stage>> {
        let listed = devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let mut stages = Vec::with_capacity(self.0.len() + 1);
        let mut next = 0;
        for e in &self.0 {
            let stage_devices = e
                .ordinals
                .iter()
                .map(|o| {
                    devices
                        .iter()
                        .find(|d| d.ordinal() == *o)
                        .copied()
                        .ok_or_else(|| {
                            bad(format!("ordinal {o} is not among the devices ({listed})"))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            if next + e.layers > num_layers {
                let given: usize = self.0.iter().map(|e| e.layers).sum();
                return Err(bad(format!(
                    "the map places {given} layers but the model has {num_layers}; give at most \
                     {num_layers} in all (layers left over run on the host)"
                )));
            }
            stages.push(Stage {
                devices: stage_devices,
                layers: next..next + e.layers,
                host: false,
            });
            next += e.layers;
        }
        if next < num_layers {
            let ranks = self.0.first().map_or(1, |e| e.ordinals.len());
            stages.push(Stage {
                devices: (0..ranks).map(DeviceSpec::Cpu).collect(),
                layers: next..num_layers,
                host: true,
            });
        }
        Ok(stages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: usize) -> Vec<DeviceSpec> {
        (0..n).map(DeviceSpec::Cpu).collect()
    }

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn maps_layers_in_order_with_host_layers_last() -> Result<()> {
        let map: LayerMap = "0:16;1:14".parse()?;
        let stages = map.stages(&cpus(2), 30)?;
        assert_eq!(
            stages.iter().map(|s| s.layers.clone()).collect::<Vec<_>>(),
            vec![0..16, 16..30]
        );
        let stages: Vec<Stage> = "1:10".parse::<LayerMap>()?.stages(&cpus(2), 30)?;
        assert_eq!(
            stages[0],
            Stage {
                devices: vec![DeviceSpec::Cpu(1)],
                layers: 0..10,
                host: false
            }
        );
        assert_eq!(
            stages[1],
            Stage {
                devices: vec![DeviceSpec::Cpu(0)],
                layers: 10..30,
                host: true
            }
        );
        Ok(())
    }

    #[test]
    fn gpu_stages_come_first_and_the_host_takes_the_rest() -> Result<()> {
        let gpus = DeviceSpec::parse_list("cuda:0,cuda:1")?;
        let stages = "1:3;0:2".parse::<LayerMap>()?.stages(&gpus, 8)?;
        let got: Vec<(DeviceSpec, std::ops::Range<usize>, bool)> = stages
            .into_iter()
            .map(|s| (s.devices[0], s.layers, s.host))
            .collect();
        assert_eq!(
            got,
            vec![
                (DeviceSpec::Cuda(1), 0..3, false),
                (DeviceSpec::Cuda(0), 3..5, false),
                (DeviceSpec::Cpu(0), 5..8, true),
            ]
        );
        Ok(())
    }

    #[test]
    fn bad_maps_say_what_would_work() {
        assert!(err("0:16;1:16"
            .parse::<LayerMap>()
            .and_then(|m| m.stages(&cpus(2), 30)))
        .contains("at most 30"));
        assert!(err("0:16;2:14"
            .parse::<LayerMap>()
            .and_then(|m| m.stages(&cpus(2), 30)))
        .contains("ordinal 2 is not among the devices (cpu:0, cpu:1)"));
        assert!(err("0:16;0:14".parse::<LayerMap>()).contains("appears twice"));
        assert!(err("0,1:16;1,2:14".parse::<LayerMap>()).contains("ordinal 1 appears twice"));
        assert!(err("0,1:16;2:14".parse::<LayerMap>()).contains("the first has 2, '2:14' has 1"));
        assert!(err("0:0".parse::<LayerMap>()).contains("no layers"));
        assert!(err("0-16".parse::<LayerMap>()).contains("ORDINAL:LAYERS"));
        assert!(err("".parse::<LayerMap>()).contains("empty"));
        assert!(err("x:3".parse::<LayerMap>()).contains("not a device ordinal"));
    }

    #[test]
    fn stages_may_be_tensor_parallel_groups_and_the_host_matches_them() -> Result<()> {
        let map: LayerMap = "2,3:3;0,1:2".parse()?;
        let stages = map.stages(&cpus(4), 8)?;
        let got: Vec<(Vec<DeviceSpec>, std::ops::Range<usize>)> =
            stages.into_iter().map(|s| (s.devices, s.layers)).collect();
        let cpu = DeviceSpec::Cpu;
        assert_eq!(
            got,
            vec![
                (vec![cpu(2), cpu(3)], 0..3),
                (vec![cpu(0), cpu(1)], 3..5),
                (vec![cpu(0), cpu(1)], 5..8),
            ]
        );
        Ok(())
    }
}
