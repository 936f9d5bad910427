//! Which instruction set the kernels use on this machine.

use std::sync::OnceLock;

/// Kernel implementations, fastest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable reference code.
    Scalar,
    /// AVX2, FMA and F16C: 256-bit byte products.
    Avx2,
    /// AVX-512 (F, BW, VL) with VNNI, and F16C: 512-bit products accumulated by
    /// `vpdpbusd`.
    Avx512Vnni,
}

impl Isa {
    /// Every implementation this CPU can run, slowest first (detected once).
    pub fn supported() -> &'static [Isa] {
        static SUPPORTED: OnceLock<Vec<Isa>> = OnceLock::new();
        SUPPORTED.get_or_init(|| {
            let mut all = vec![Isa::Scalar];
            #[cfg(target_arch = "x86_64")]
            {
                let f16c = std::is_x86_feature_detected!("f16c");
                if f16c
                    && std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                {
                    all.push(Isa::Avx2);
                }
                if f16c
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512vnni")
                {
                    all.push(Isa::Avx512Vnni);
                }
            }
            all
        })
    }

    /// Detected once: the fastest supported, unless `TESSERA_KERNELS` (`scalar`, `avx2`,
    /// `avx512`) asks for a slower one.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let supported = Self::supported();
            let best = supported.last().copied().unwrap_or(Isa::Scalar);
            let wanted = match std::env::var("TESSERA_KERNELS").as_deref() {
                Ok("scalar") => Isa::Scalar,
                Ok("avx2") => Isa::Avx2,
                _ => best,
            };
            wanted.min(best)
        })
    }
}
