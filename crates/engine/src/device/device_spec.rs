//! Device names as users write them (`cpu:0`, `cuda:1`) and the devices they open.

use candle_core::Device;

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu(usize),
    Cuda(usize),
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu(i) => write!(f, "cpu:{i}"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl std::str::FromStr for DeviceSpec {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (kind, ordinal) = s.split_once(':').unwrap_or((s, "0"));
        let ordinal: usize = ordinal.parse().map_err(|_| {
            EngineError::Parallel(format!(
                "device '{s}': the ordinal after ':' must be a number, as in cpu:0 or cuda:1"
            ))
        })?;
        match kind {
            "cpu" => Ok(DeviceSpec::Cpu(ordinal)),
            "cuda" => Ok(DeviceSpec::Cuda(ordinal)),
            _ => Err(EngineError::Parallel(format!(
                "device '{s}': unknown kind '{kind}' (use cpu:N or cuda:N)"
            ))),
        }
    }
}

impl DeviceSpec {
    /// The device's number among those of its kind (`cuda:1` → 1).
    pub fn ordinal(&self) -> usize {
        match self {
            DeviceSpec::Cpu(i) | DeviceSpec::Cuda(i) => *i,
        }
    }

    /// Parses a comma-separated list; rejects mixed kinds and repeated CPU ranks. A CUDA
    /// device may be listed several times: its ranks then share the GPU (tensor
    /// parallelism on one GPU, joined by [`crate::tp::DeviceComm`]), and then every rank
    /// must be on that one GPU.
    pub fn parse_list(s: &str) -> Result<Vec<DeviceSpec>> {
        let list = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(str::parse)
            .collect::<Result<Vec<DeviceSpec>>>()?;
        if list.is_empty() {
            return Err(EngineError::Parallel(
                "empty device list; write e.g. cpu:0,cpu:1".into(),
            ));
        }
        let cuda = list
            .iter()
            .filter(|d| matches!(d, DeviceSpec::Cuda(_)))
            .count();
        if cuda != 0 && cuda != list.len() {
            return Err(EngineError::Parallel(
                "mixing cpu and cuda ranks in one group is not supported".into(),
            ));
        }
        let repeated = (0..list.len()).any(|i| list[..i].contains(&list[i]));
        if repeated && cuda == 0 {
            return Err(EngineError::Parallel(
                "a cpu device is listed twice; name CPU ranks cpu:0, cpu:1, ...".into(),
            ));
        }
        if repeated && list.iter().any(|d| *d != list[0]) {
            return Err(EngineError::Parallel(format!(
                "{s}: several ranks on one GPU run only when every rank is on that GPU \
                 (e.g. cuda:0,cuda:0); otherwise give each rank its own GPU"
            )));
        }
        Ok(list)
    }

    /// True when the list puts several ranks on one GPU.
    pub fn shares_one_gpu(list: &[DeviceSpec]) -> bool {
        list.len() > 1
            && matches!(list[0], DeviceSpec::Cuda(_))
            && list.iter().all(|d| *d == list[0])
    }

    /// Opens the device. A CUDA device is opened once per rank: candle's CUDA device
    /// launches on the per-thread stream of whichever thread calls it, so each rank's
    /// kernels run on its own worker thread's stream.
    pub fn open(&self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu(_) => Ok(Device::Cpu),
            #[cfg(feature = "cuda")]
            DeviceSpec::Cuda(i) => {
                let device = Device::new_cuda(*i).map_err(|e| {
                    EngineError::Parallel(format!("cuda:{i}: cannot open the device: {e}"))
                })?;
                if let Device::Cuda(d) = &device {
                    // Refused here, by name, rather than by a PTX load error at the first
                    // launch.
                    let ctx = d.cuda_stream().context().clone();
                    let cap = ctx.compute_capability().map_err(|e| {
                        EngineError::Parallel(format!("cuda:{i}: cannot query the device: {e}"))
                    })?;
                    let built = tessera_kernels::gpu::launch::kernels_compute_cap();
                    tessera_kernels::gpu::launch::check_compute_capability(cap.0, cap.1, built)
                        .map_err(|why| {
                            let name = ctx.name().unwrap_or_else(|_| "GPU".into());
                            EngineError::Parallel(format!("cuda:{i} ({name}): {why}"))
                        })?;
                    // SAFETY: each rank queues all its work on its own stream; where data
                    // crosses streams (weights uploaded by the loading thread, tensors
                    // shared by ranks on one GPU, stages handing on hidden states) the
                    // engine synchronizes explicitly, so cudarc's per-buffer events, one
                    // record per kernel argument, are not needed.
                    unsafe { d.disable_event_tracking() };
                }
                Ok(device)
            }
            #[cfg(not(feature = "cuda"))]
            DeviceSpec::Cuda(i) => Err(EngineError::Parallel(format!(
                "cuda:{i}: this build has no CUDA support (build with --features cuda); use cpu ranks"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_rejects_bad_ones() -> Result<()> {
        assert_eq!(
            DeviceSpec::parse_list("cpu:0, cpu:1")?,
            vec![DeviceSpec::Cpu(0), DeviceSpec::Cpu(1)]
        );
        assert_eq!(DeviceSpec::parse_list("cuda")?, vec![DeviceSpec::Cuda(0)]);
        for bad in [
            "",
            "gpu:0",
            "cpu:x",
            "cpu:0,cpu:0",
            "cpu:0,cuda:0",
            "cuda:0,cuda:0,cuda:1",
        ] {
            assert!(DeviceSpec::parse_list(bad).is_err(), "{bad}");
        }
        let shared = DeviceSpec::parse_list("cuda:0,cuda:0,cuda:0")?;
        assert!(DeviceSpec::shares_one_gpu(&shared));
        assert!(!DeviceSpec::shares_one_gpu(&DeviceSpec::parse_list(
            "cuda:0,cuda:1"
        )?));
        assert!(!DeviceSpec::shares_one_gpu(&DeviceSpec::parse_list(
            "cuda:0"
        )?));
        Ok(())
    }
}
