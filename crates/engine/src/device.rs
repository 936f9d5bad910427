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
    /// Parses a comma-separated list; rejects duplicates and mixed kinds.
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
        for (i, d) in list.iter().enumerate() {
            if list[..i].contains(d) {
                return Err(EngineError::Parallel(format!("device {d} is listed twice")));
            }
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
        Ok(list)
    }

    pub fn open(&self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu(_) => Ok(Device::Cpu),
            DeviceSpec::Cuda(i) => Err(EngineError::Parallel(format!(
                "cuda:{i}: this build has no CUDA model support; use cpu ranks"
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
        for bad in ["", "gpu:0", "cpu:x", "cpu:0,cpu:0", "cpu:0,cuda:0"] {
            assert!(DeviceSpec::parse_list(bad).is_err(), "{bad}");
        }
        Ok(())
    }
}
