//! `--device-memory-mib cuda:0=20000,cuda:1=20000`: the most the automatic layer map may
//! use on each device, and with `host=MiB` on the host. On GPUs it narrows what free
//! memory allows; on CPU ranks, which share the host's memory, it is what a device has.

use crate::device::device_spec::DeviceSpec;
use crate::error::{EngineError, Result};

/// Parsed `--device-memory-mib`, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    pub devices: Vec<(DeviceSpec, usize)>,
    pub host: Option<usize>,
}

fn bad(msg: String) -> EngineError {
    EngineError::Config(format!("--device-memory-mib: {msg}"))
}

impl std::str::FromStr for DeviceMemory {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        let mut caps = DeviceMemory::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, mib) = part.split_once('=').ok_or_else(|| {
                bad(format!(
                    "'{part}' is not DEVICE=MIB, as in \"cuda:0=20000,cuda:1=20000\""
                ))
            })?;
            let mib: usize = mib
                .trim()
                .parse()
                .map_err(|_| bad(format!("'{mib}' in '{part}' is not a number of MiB")))?;
            let bytes = mib << 20;
            let name = name.trim();
            if name == "host" {
                if caps.host.replace(bytes).is_some() {
                    return Err(bad("host appears twice".into()));
                }
                continue;
            }
            let device: DeviceSpec = name.parse().map_err(|e| bad(format!("{e}")))?;
            if caps.devices.iter().any(|(d, _)| *d == device) {
                return Err(bad(format!("{device} appears twice")));
            }
            caps.devices.push((device, bytes));
        }
        if caps.devices.is_empty() && caps.host.is_none() {
            return Err(bad("empty; write e.g. \"cuda:0=20000,cuda:1=20000\"".into()));
        }
        Ok(caps)
    }
}

impl DeviceMemory {
    /// The cap of `device`, where one is given.
    pub fn of(&self, device: &DeviceSpec) -> Option<usize> {
        self.devices
            .iter()
            .find(|(d, _)| d == device)
            .map(|(_, b)| *b)
    }

    /// Caps naming devices that are not among `devices`: a typo to refuse.
    pub fn check_devices(&self, devices: &[DeviceSpec]) -> Result<()> {
        match self.devices.iter().find(|(d, _)| !devices.contains(d)) {
            Some((d, _)) => Err(bad(format!(
                "{d} is not among the devices ({})",
                devices
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices_and_the_host() -> Result<()> {
        let caps: DeviceMemory = "cuda:0=20000, cuda:1=100,host=64".parse()?;
        assert_eq!(caps.of(&DeviceSpec::Cuda(0)), Some(20000 << 20));
        assert_eq!(caps.of(&DeviceSpec::Cuda(1)), Some(100 << 20));
        assert_eq!(caps.of(&DeviceSpec::Cuda(2)), None);
        assert_eq!(caps.host, Some(64 << 20));
        Ok(())
    }

    #[test]
    fn bad_caps_say_what_would_work() {
        let err = |s: &str| {
            s.parse::<DeviceMemory>()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("cuda:0").contains("DEVICE=MIB"));
        assert!(err("cuda:0=lots").contains("not a number of MiB"));
        assert!(err("cuda:0=1,cuda:0=2").contains("appears twice"));
        assert!(err("").contains("empty"));
        let caps: DeviceMemory = "cpu:2=30".parse().unwrap_or_default();
        let e = caps
            .check_devices(&[DeviceSpec::Cpu(0), DeviceSpec::Cpu(1)])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("cpu:2 is not among the devices (cpu:0, cpu:1)"),
            "{e}"
        );
    }
}
