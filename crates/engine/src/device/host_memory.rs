//! Host memory for the KV cache of CPU ranks: how much the machine (or the container's
//! memory limit) has available once the weights are loaded, and the share of it the
//! cache takes (`--cpu-kv-cache-utilization`), as `--gpu-memory-utilization` does on GPUs.
//!
//! The cache's memory is reserved at load but becomes resident only as sequences write
//! into its blocks, so the share is of what is free when the server starts, and the
//! reserve is what stays free once the cache is full.
//!
//! The arithmetic is plain Rust with the readings passed in, so it is tested with made-up
//! machines; [`HostMemory::read`] reads `/proc/meminfo` and the cgroup's limit.

use crate::error::{EngineError, Result};

/// How CPU ranks size their KV cache when no budget is given.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuKvSizing {
    /// Share of the memory available after the weights that the cache may take, in
    /// (0, 1].
    pub utilization: f64,
    /// Bytes always left to the rest of the machine: the OS, the server's own
    /// allocations and the chat-template sandboxes (each may take its memory limit).
    pub reserve_bytes: usize,
}

/// Memory of the machine as seen from this process, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// What the kernel says can be allocated without swapping (`MemAvailable`), or what
    /// is left under the cgroup's limit when that is less.
    pub available_bytes: usize,
    pub total_bytes: usize,
}

impl HostMemory {
    /// Reads `/proc/meminfo`, then narrows it to the cgroup's limit (v2 `memory.max`
    /// and `memory.current`, or v1's `limit_in_bytes` and `usage_in_bytes`) where one is
    /// set: in a container, the machine's free memory is not the container's.
    pub fn read() -> Result<HostMemory> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
            EngineError::Config(format!(
                "cannot read /proc/meminfo to size the KV cache ({e}); give --kv-cache-memory-mib"
            ))
        })?;
        let mut memory = parse_meminfo(&meminfo).ok_or_else(|| {
            EngineError::Config(
                "/proc/meminfo has no MemAvailable to size the KV cache by; give --kv-cache-memory-mib"
                    .into(),
            )
        })?;
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let cgroup = [
            ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            ),
        ]
        .into_iter()
        .find_map(|(limit, usage)| Some((read(limit)?, read(usage)?)));
        if let Some((limit, usage)) = cgroup {
            memory = memory.within_cgroup(&limit, &usage);
        }
        Ok(memory)
    }

    /// This memory narrowed to a cgroup's limit and usage as their files state them
    /// ("max" or a number beyond the machine: no limit).
    pub fn within_cgroup(self, limit: &str, usage: &str) -> HostMemory {
        let (Ok(limit), Ok(usage)) = (limit.trim().parse::<usize>(), usage.trim().parse::<usize>())
        else {
            return self;
        };
        if limit >= self.total_bytes {
            return self;
        }
        HostMemory {
            available_bytes: self.available_bytes.min(limit.saturating_sub(usage)),
            total_bytes: limit,
        }
    }
}

/// `MemAvailable` and `MemTotal` of a `/proc/meminfo` text, in bytes.
pub fn parse_meminfo(text: &str) -> Option<HostMemory> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse::<usize>().ok())
            .map(|kib| kib << 10)
    };
    Some(HostMemory {
        available_bytes: field("MemAvailable:")?,
        total_bytes: field("MemTotal:")?,
    })
}

/// Bytes of KV cache all CPU ranks of this process take together: `utilization` of the
/// memory available, less what must stay free (`reserve_bytes`), and no more than
/// `needed_bytes` (every sequence the scheduler may run at its longest context).
pub fn cpu_kv_budget(
    memory: &HostMemory,
    sizing: &CpuKvSizing,
    needed_bytes: usize,
) -> Result<usize> {
    let u = sizing.utilization;
    if !(u > 0.0 && u <= 1.0) {
        return Err(EngineError::Config(format!(
            "--cpu-kv-cache-utilization must be above 0 and at most 1, not {u}"
        )));
    }
    let share = (memory.available_bytes as f64 * u) as usize;
    let left = memory.available_bytes.saturating_sub(sizing.reserve_bytes);
    let budget = share.min(left).min(needed_bytes);
    if budget == 0 {
        return Err(EngineError::Config(format!(
            "{} MiB of memory are available after the weights and {} MiB must stay free for \
             the OS and the chat-template sandboxes: nothing is left for the KV cache; give \
             --kv-cache-memory-mib, or lower --chat-template-memory-mib",
            memory.available_bytes >> 20,
            sizing.reserve_bytes >> 20
        )));
    }
    Ok(budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    fn machine(available: usize, total: usize) -> HostMemory {
        HostMemory {
            available_bytes: available,
            total_bytes: total,
        }
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  1000 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some(machine(20_480_000 << 10, 24_576_000 << 10))
        );
        assert_eq!(parse_meminfo("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn a_container_limit_narrows_what_is_available() {
        let host = machine(20 * GIB, 24 * GIB);
        let limited = host.within_cgroup(&(8 * GIB).to_string(), &(3 * GIB).to_string());
        assert_eq!(limited, machine(5 * GIB, 8 * GIB));
        // No limit ("max"), or one above the machine: the machine's figures.
        assert_eq!(host.within_cgroup("max\n", "123\n"), host);
        assert_eq!(
            host.within_cgroup(&(64 * GIB).to_string(), &GIB.to_string()),
            host
        );
    }

    #[test]
    fn the_budget_is_a_share_of_what_is_available_and_leaves_the_reserve() {
        let sizing = CpuKvSizing {
            utilization: 0.5,
            reserve_bytes: 3 * GIB,
        };
        // 20 GiB available: half of it.
        assert_eq!(
            cpu_kv_budget(&machine(20 * GIB, 24 * GIB), &sizing, usize::MAX).ok(),
            Some(10 * GIB)
        );
        // 4 GiB available: the reserve wins over the share.
        assert_eq!(
            cpu_kv_budget(&machine(4 * GIB, 8 * GIB), &sizing, usize::MAX).ok(),
            Some(GIB)
        );
        // Never more than every sequence can use.
        assert_eq!(
            cpu_kv_budget(&machine(20 * GIB, 24 * GIB), &sizing, 700 << 20).ok(),
            Some(700 << 20)
        );
        // Nothing left: refused with the flag that fixes it.
        let err = cpu_kv_budget(&machine(2 * GIB, 8 * GIB), &sizing, usize::MAX)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--kv-cache-memory-mib"), "{err}");
        let bad = CpuKvSizing {
            utilization: 1.5,
            ..sizing
        };
        assert!(cpu_kv_budget(&machine(20 * GIB, 24 * GIB), &bad, usize::MAX).is_err());
    }

    #[test]
    fn this_machine_can_be_read() {
        let memory = HostMemory::read().map_err(|e| e.to_string());
        let memory = memory.as_ref().map(|m| (m.available_bytes, m.total_bytes));
        assert!(
            matches!(memory, Ok((a, t)) if a > 0 && a <= t),
            "{memory:?}"
        );
    }
}
