//! GPU memory: how much KV cache fits (`--gpu-memory-utilization`), and the default
//! tensor split across GPUs in proportion to their free memory (as llama.cpp splits).
//!
//! The arithmetic is plain Rust, tested on CPU; `measure` (feature `cuda`) reads the
//! device and its stream-ordered allocator.

use crate::error::{EngineError, Result};

/// What was measured on one GPU after the weights were loaded and a profile step ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceUsage {
    pub total_bytes: usize,
    /// Memory in use once the profile step's temporaries were freed: weights, the
    /// provisional KV cache, library workspaces, the context.
    pub used_bytes: usize,
    /// The most the profile step held at once beyond `used_bytes` (activations).
    pub activation_peak_bytes: usize,
    /// KV cache allocated for the profile step, to be replaced.
    pub provisional_kv_bytes: usize,
}

/// Bytes of KV cache each of `ranks` ranks on the device may take so that all use stays
/// under `utilization` of the device.
pub fn kv_budget_per_rank(usage: &DeviceUsage, utilization: f64, ranks: usize) -> Result<usize> {
    if !(utilization > 0.0 && utilization <= 1.0) {
        return Err(EngineError::Config(format!(
            "--gpu-memory-utilization must be in (0, 1], not {utilization}"
        )));
    }
    let allowed = (usage.total_bytes as f64 * utilization) as usize;
    let reserved =
        usage.used_bytes.saturating_sub(usage.provisional_kv_bytes) + usage.activation_peak_bytes;
    if allowed <= reserved {
        return Err(EngineError::Config(format!(
            "weights and activations take {} MiB of the {} MiB that --gpu-memory-utilization {utilization} allows \
             on this GPU ({} MiB in all): nothing is left for the KV cache; raise the utilization, \
             lower --max-batch-tokens, or spread the model over more GPUs",
            reserved >> 20,
            allowed >> 20,
            usage.total_bytes >> 20
        )));
    }
    Ok((allowed - reserved) / ranks.max(1))
}

/// Default shares of distinct GPUs: proportional to their free memory. Ranks that share
/// one GPU (or have no figure) get equal shares.
pub fn split_by_free_memory(free_bytes: &[usize]) -> Vec<f64> {
    let total: usize = free_bytes.iter().sum();
    if total == 0 {
        return vec![1.0; free_bytes.len()];
    }
    free_bytes
        .iter()
        .map(|f| *f as f64 / total as f64 * free_bytes.len() as f64)
        .collect()
}

#[cfg(feature = "cuda")]
pub use measure::{measure, reset_peak, PoolCounters};

#[cfg(feature = "cuda")]
mod measure {
    use candle_core::cuda::cudarc::driver::sys;
    use candle_core::Device;

    use crate::error::{EngineError, Result};

    fn driver(what: &str, r: sys::CUresult) -> Result<()> {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(EngineError::Parallel(format!("CUDA {what}: {r:?}")))
        }
    }

    /// The default memory pool of `device`'s GPU, with its context current here.
    fn pool(device: &Device) -> Result<sys::CUmemoryPool> {
        let Device::Cuda(dev) = device else {
            return Err(EngineError::Parallel("not a CUDA device".into()));
        };
        let ctx = dev.cuda_stream().context().clone();
        ctx.bind_to_thread()
            .map_err(|e| EngineError::Parallel(format!("CUDA context: {e}")))?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer and the context's device.
        driver("memory pool", unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
        })?;
        Ok(pool)
    }

    fn attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<usize> {
        let mut value: u64 = 0;
        // SAFETY: these attributes are 64-bit values.
        driver("memory pool attribute", unsafe {
            sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast())
        })?;
        Ok(value as usize)
    }

    /// Counters of the stream-ordered allocator that candle allocates from.
    #[derive(Debug, Clone, Copy)]
    pub struct PoolCounters {
        pub used: usize,
        pub used_high: usize,
        pub reserved: usize,
    }

    fn counters(pool: sys::CUmemoryPool) -> Result<PoolCounters> {
        use sys::CUmemPool_attribute as A;
        Ok(PoolCounters {
            used: attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved: attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        })
    }

    /// Restarts the pool's high-water mark from its current use.
    pub fn reset_peak(device: &Device) -> Result<PoolCounters> {
        let pool = pool(device)?;
        let mut zero: u64 = 0;
        // SAFETY: setting USED_MEM_HIGH to 0 resets it to the current use.
        driver("reset memory peak", unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        })?;
        counters(pool)
    }

    /// Free and total device memory, and the pool's counters.
    pub fn measure(device: &Device) -> Result<(usize, usize, PoolCounters)> {
        let pool = pool(device)?;
        let Device::Cuda(dev) = device else {
            return Err(EngineError::Parallel("not a CUDA device".into()));
        };
        let (free, total) = dev
            .cuda_stream()
            .context()
            .mem_get_info()
            .map_err(|e| EngineError::Parallel(format!("CUDA memory info: {e}")))?;
        Ok((free, total, counters(pool)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    #[test]
    fn the_budget_is_what_the_utilization_leaves_after_weights_and_activations() -> Result<()> {
        let usage = DeviceUsage {
            total_bytes: 80 * GIB,
            used_bytes: 17 * GIB,
            activation_peak_bytes: GIB,
            provisional_kv_bytes: GIB,
        };
        // 72 GiB allowed, 16 GiB of weights etc. and 1 GiB of activations.
        assert_eq!(kv_budget_per_rank(&usage, 0.9, 1)?, 55 * GIB);
        assert_eq!(kv_budget_per_rank(&usage, 0.9, 4)?, (55 * GIB) / 4);
        Ok(())
    }

    #[test]
    fn no_room_is_an_error_that_names_the_flag() {
        let usage = DeviceUsage {
            total_bytes: 16 * GIB,
            used_bytes: 15 * GIB,
            activation_peak_bytes: GIB,
            provisional_kv_bytes: 0,
        };
        let err = kv_budget_per_rank(&usage, 0.9, 1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--gpu-memory-utilization"), "{err}");
        assert!(kv_budget_per_rank(&usage, 1.5, 1).is_err());
        assert!(kv_budget_per_rank(&usage, 0.0, 1).is_err());
    }

    #[test]
    fn shares_follow_free_memory() {
        let shares = split_by_free_memory(&[60 * GIB, 20 * GIB]);
        assert_eq!(shares, vec![1.5, 0.5]);
        assert_eq!(split_by_free_memory(&[0, 0]), vec![1.0, 1.0]);
    }
}
