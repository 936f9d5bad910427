//! The element types a rank computes in: dense weights and matmul inputs in f32 on CPU
//! ranks, in bf16 on CUDA ranks (whose KV cache holds the same type). Below the loader and
//! the model, which both place tensors on a device in its type.

use candle_core::{DType, Device};
use tessera_kernels::gpu::launch::KvDtype;

/// The element type of a CUDA rank's matmul inputs and KV cache. The kernels take f16
/// as well; nothing chooses it yet.
pub const ACTIVATIONS: KvDtype = KvDtype::Bf16;

/// The candle dtype of a KV element type.
pub fn candle_dtype(d: KvDtype) -> DType {
    match d {
        KvDtype::Bf16 => DType::BF16,
        KvDtype::F16 => DType::F16,
    }
}

/// The dtype of dense weights and of the activations matmuls read on `device`: f32 on
/// CPU (our kernels and candle's fast CPU paths), bf16 on CUDA (cuBLAS tensor cores;
/// results accumulate in f32).
pub fn compute_dtype(device: &Device) -> DType {
    compute_dtype_of_kind(device.is_cuda())
}

/// [`compute_dtype`] of a CUDA device (`cuda`) or the host, without opening either.
pub fn compute_dtype_of_kind(cuda: bool) -> DType {
    match cuda {
        true => candle_dtype(ACTIVATIONS),
        false => DType::F32,
    }
}

pub use tessera_kernels::kv_quant::KvCacheDtype;

/// What the KV cache of CPU ranks stores under `--kv-cache-dtype auto`: the type they
/// compute in. Neither 8-bit type keeps greedy text equal to a 16-bit cache on most
/// prompts (measured on SmolLM2: int8 0 of 7, fp8 2 of 7; Gemma 3 270M: 1 of 7 each, see
/// `docs/fidelity.md`), the bound a default must meet; both stay a choice.
pub const CPU_AUTO_KV: KvCacheDtype = KvCacheDtype::F32;

/// `--kv-cache-dtype`: what the KV cache stores, or `auto` to let each device choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheDtypeChoice {
    /// bf16 on GPUs; on CPU ranks [`CPU_AUTO_KV`].
    Auto,
    Fixed(KvCacheDtype),
}

impl KvCacheDtypeChoice {
    /// The names `--kv-cache-dtype` takes.
    pub const NAMES: &'static str = "auto, bf16, fp16, fp8 (fp8_e4m3), int8, f32 (CPU ranks only)";

    /// The type a rank's cache stores, for a rank that runs the CUDA ranks' forward pass
    /// (`gpu_path`) or the CPU one; a type the device cannot hold is refused by name.
    pub fn resolve(self, gpu_path: bool) -> crate::error::Result<KvCacheDtype> {
        let dtype = match (self, gpu_path) {
            (KvCacheDtypeChoice::Auto, true) => KvCacheDtype::Bf16,
            (KvCacheDtypeChoice::Auto, false) => CPU_AUTO_KV,
            (KvCacheDtypeChoice::Fixed(d), _) => d,
        };
        if gpu_path && !gpu_holds(dtype) {
            return Err(crate::error::EngineError::Config(format!(
                "--kv-cache-dtype {dtype}: CUDA ranks compute in bf16 and their KV cache holds \
                 bf16, fp8_e4m3 or int8"
            )));
        }
        Ok(dtype)
    }
}

/// The type a rank's KV cache stores for `choice` (`EngineConfig::kv_cache_dtype`), or
/// without one the type the rank computes in: f32 on CPU ranks, bf16 on CUDA ranks.
pub fn kv_cache_dtype(
    choice: Option<KvCacheDtypeChoice>,
    gpu_path: bool,
) -> crate::error::Result<KvCacheDtype> {
    match choice {
        Some(c) => c.resolve(gpu_path),
        None if gpu_path => Ok(KvCacheDtype::Bf16),
        None => Ok(KvCacheDtype::F32),
    }
}

/// The cache types the CUDA ranks' kernels read and write with their activations
/// ([`ACTIVATIONS`], bf16): that type, or int8 or fp8 E4M3 with scales (quantized on
/// write, dequantized on read).
fn gpu_holds(dtype: KvCacheDtype) -> bool {
    tessera_kernels::gpu::quantized::holds(ACTIVATIONS, dtype)
}

impl std::str::FromStr for KvCacheDtypeChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let fixed = |d| Ok(KvCacheDtypeChoice::Fixed(d));
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(KvCacheDtypeChoice::Auto),
            "bf16" => fixed(KvCacheDtype::Bf16),
            "fp16" | "f16" => fixed(KvCacheDtype::F16),
            "fp8" | "fp8_e4m3" => fixed(KvCacheDtype::Fp8E4m3),
            "int8" => fixed(KvCacheDtype::Int8),
            "f32" => fixed(KvCacheDtype::F32),
            other => Err(format!(
                "unknown KV cache dtype '{other}' (expected one of: {})",
                Self::NAMES
            )),
        }
    }
}

impl std::fmt::Display for KvCacheDtypeChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvCacheDtypeChoice::Auto => f.write_str("auto"),
            KvCacheDtypeChoice::Fixed(d) => d.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cache_dtypes_parse_and_resolve_per_device() {
        let parse = |s: &str| s.parse::<KvCacheDtypeChoice>();
        assert_eq!(
            parse("fp8"),
            Ok(KvCacheDtypeChoice::Fixed(KvCacheDtype::Fp8E4m3))
        );
        assert_eq!(parse("FP8_E4M3"), parse("fp8"));
        assert_eq!(
            parse("fp16"),
            Ok(KvCacheDtypeChoice::Fixed(KvCacheDtype::F16))
        );
        let err = parse("q4_0").err().unwrap_or_default();
        assert!(err.contains("q4_0") && err.contains("int8"), "{err}");
        let auto = KvCacheDtypeChoice::Auto;
        assert_eq!(auto.resolve(true).ok(), Some(KvCacheDtype::Bf16));
        assert_eq!(auto.resolve(false).ok(), Some(CPU_AUTO_KV));
        // A type the GPU kernels cannot hold is refused, not replaced.
        for name in ["f32", "fp16"] {
            let err = parse(name)
                .ok()
                .and_then(|c| c.resolve(true).err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("CUDA ranks"), "{name}: {err}");
        }
        for name in ["bf16", "fp8", "int8"] {
            assert!(parse(name).is_ok_and(|c| c.resolve(true).is_ok()), "{name}");
        }
        for name in ["f32", "bf16", "fp16", "fp8", "int8"] {
            assert!(
                parse(name).is_ok_and(|c| c.resolve(false).is_ok()),
                "{name}"
            );
        }
    }
}
