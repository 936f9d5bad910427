//! Rounding without a libm call (x86-64's baseline has no rounding instruction, so
//! `round_ties_even` calls `rintf`): plain lane arithmetic, so loops over it vectorize.

/// `v` rounded half to even, as an integer: adding 1.5·2²³ leaves the nearest integer
/// (ties to even, the default rounding mode) in the low mantissa bits, exactly, for
/// |v| < 2²².
#[inline(always)]
pub(crate) fn round_even_i32(v: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    ((v + MAGIC).to_bits() as i32) - MAGIC.to_bits() as i32
}
