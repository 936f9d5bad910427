//! Block dot products: scalar references and runtime dispatch to SIMD versions.

use std::sync::OnceLock;

use crate::cpu::blocks::{BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};

/// The instruction set the dot products use on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
}

/// Detected once; `TESSERA_KERNELS=scalar` forces the reference path.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("TESSERA_KERNELS").is_ok_and(|v| v == "scalar") {
            return Isa::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Isa::Avx2;
        }
        Isa::Scalar
    })
}

/// Σ over blocks of `d_x·d_y·Σ q_x q_y + m_x·s_y` (ggml's Q4_1 × Q8_1).
pub fn dot_q4_1_q8_1_scalar(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for j in 0..QK / 2 {
            let lo = i32::from(bx.qs[j] & 0x0F);
            let hi = i32::from(bx.qs[j] >> 4);
            sumi += lo * i32::from(by.qs[j]) + hi * i32::from(by.qs[j + QK / 2]);
        }
        sum += bx.d * by.d * sumi as f32 + bx.m * by.s;
    }
    sum
}

/// Σ over blocks of `d_x·d_y·Σ q_x q_y` (ggml's Q8_0 × Q8_0).
pub fn dot_q8_0_q8_0_scalar(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (bx, by) in x.iter().zip(y) {
        let sumi: i32 = bx
            .qs
            .iter()
            .zip(&by.qs)
            .map(|(a, b)| i32::from(*a) * i32::from(*b))
            .sum();
        sum += bx.d * by.d * sumi as f32;
    }
    sum
}

pub fn dot_q4_1_q8_1(isa: Isa, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only returned after detecting AVX2 and FMA.
        Isa::Avx2 => unsafe { crate::cpu::x86::dot_q4_1_q8_1_avx2(x, y) },
        _ => dot_q4_1_q8_1_scalar(x, y),
    }
}

pub fn dot_q8_0_q8_0(isa: Isa, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only returned after detecting AVX2 and FMA.
        Isa::Avx2 => unsafe { crate::cpu::x86::dot_q8_0_q8_0_avx2(x, y) },
        _ => dot_q8_0_q8_0_scalar(x, y),
    }
}

/// A weight block format with its activation format and dot products.
pub trait WeightBlock: Sync + Sized {
    /// The block format activations are quantized to for this weight format.
    type Act: Sync + Default + Clone;
    fn quantize_row(xs: &[f32], out: &mut [Self::Act]);
    fn dot(isa: Isa, x: &[Self], y: &[Self::Act]) -> f32;
    /// Four rows at once; each result equals [`WeightBlock::dot`] of that row.
    fn dot4(isa: Isa, x: [&[Self]; 4], y: &[Self::Act]) -> [f32; 4] {
        std::array::from_fn(|r| Self::dot(isa, x[r], y))
    }
}

impl WeightBlock for BlockQ4_1 {
    type Act = BlockQ8_1;
    fn quantize_row(xs: &[f32], out: &mut [BlockQ8_1]) {
        crate::cpu::quantize::quantize_row_q8_1(xs, out);
    }
    fn dot(isa: Isa, x: &[Self], y: &[BlockQ8_1]) -> f32 {
        dot_q4_1_q8_1(isa, x, y)
    }
    fn dot4(isa: Isa, x: [&[Self]; 4], y: &[BlockQ8_1]) -> [f32; 4] {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only returned after detecting AVX2 and FMA; callers
            // pass rows as long as `y`.
            Isa::Avx2 => unsafe { crate::cpu::x86::dot4_q4_1_q8_1_avx2(x, y) },
            _ => std::array::from_fn(|r| dot_q4_1_q8_1_scalar(x[r], y)),
        }
    }
}

impl WeightBlock for BlockQ8_0 {
    type Act = BlockQ8_0;
    fn quantize_row(xs: &[f32], out: &mut [BlockQ8_0]) {
        crate::cpu::quantize::quantize_row_q8_0(xs, out);
    }
    fn dot(isa: Isa, x: &[Self], y: &[BlockQ8_0]) -> f32 {
        dot_q8_0_q8_0(isa, x, y)
    }
    fn dot4(isa: Isa, x: [&[Self]; 4], y: &[BlockQ8_0]) -> [f32; 4] {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as for Q4_1.
            Isa::Avx2 => unsafe { crate::cpu::x86::dot4_q8_0_q8_0_avx2(x, y) },
            _ => std::array::from_fn(|r| dot_q8_0_q8_0_scalar(x[r], y)),
        }
    }
}
