//! Builds of the engine's own CPU loops for the widest vector unit this CPU has. The
//! crate is compiled for baseline x86-64 (SSE2) so one binary runs everywhere; a loop
//! written once as an `#[inline(always)]` body is compiled again under AVX2 and AVX-512
//! and picked at run time. Rust never fuses a multiply and an add on its own, so every
//! build computes the same values in the same order.

/// The widest vector instructions available for the engine's loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simd {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Simd {
    /// Detected once per process.
    pub fn detect() -> Self {
        static SIMD: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *SIMD.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let fma = std::is_x86_feature_detected!("fma");
                if std::is_x86_feature_detected!("avx512f") && fma {
                    return Simd::Avx512;
                }
                if std::is_x86_feature_detected!("avx2") && fma {
                    return Simd::Avx2;
                }
            }
            Simd::Baseline
        })
    }
}

/// Defines `pub fn $name(args) -> ret` that runs `$body` compiled for [`Simd::detect`].
macro_rules! simd_dispatch {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            /// # Safety
            /// The CPU must support AVX-512F and FMA.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
            /// # Safety
            /// The CPU must support AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
            match $crate::model::simd::Simd::detect() {
                // SAFETY: `Avx512` is only detected on CPUs with AVX-512F and FMA.
                #[cfg(target_arch = "x86_64")]
                $crate::model::simd::Simd::Avx512 => unsafe { avx512($($arg),*) },
                // SAFETY: `Avx2` is only detected on CPUs with AVX2 and FMA.
                #[cfg(target_arch = "x86_64")]
                $crate::model::simd::Simd::Avx2 => unsafe { avx2($($arg),*) },
                $crate::model::simd::Simd::Baseline => body($($arg),*),
            }
        }
    };
}
pub(crate) use simd_dispatch;
