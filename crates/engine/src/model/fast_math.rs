//! Elementary functions written so the loops over them vectorize.

/// `e^x` for `x <= 0` (softmax terms after subtracting the maximum), branch-free so
/// loops over it vectorize: `x = i·ln 2 + r` with `|r| <= ln 2 / 2` (ln 2 split in two
/// parts so `r` is exact), `e^r` by its degree-6 Taylor polynomial, times `2^i`.
/// Relative error about 2e-7 in the normal range; below it, a value under 1e-36.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    exp_clamped(x.min(0.0))
}

/// `e^x` for `x` in `[-87, 88]` (outside it, the value at the nearer end), by the method
/// of [`exp_nonpositive`].
#[inline(always)]
pub fn exp_clamped(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let i = round_even(x * std::f32::consts::LOG2_E);
    let r = (x - i * LN2_HI) - i * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    f32::from_bits(((i as i32 + 127) as u32) << 23) * p
}

/// Round half to even by adding and subtracting 1.5·2²³, exact for `|v| < 2²²`: plain
/// arithmetic, so it vectorizes without SSE4.1's `roundps` (`f32::round` becomes a libm
/// call in a baseline x86-64 build).
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// SiLU, `x · sigmoid(x)`, branch-free.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp_clamped(-x))
}

/// GELU by its tanh approximation, `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`, as
/// `gelu_pytorch_tanh`; tanh(u) written as `1 − 2 / (e^{2u} + 1)`.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    let tanh = 1.0 - 2.0 / (exp_clamped(2.0 * u) + 1.0);
    0.5 * x * (1.0 + tanh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_tanh_matches_its_definition() {
        for i in -400..=400 {
            let x = i as f32 * 0.025;
            let want = 0.5
                * x
                * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
            let got = gelu_tanh(x);
            assert!(
                (got - want).abs() <= 2e-6 * want.abs().max(1.0),
                "x {x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn fast_exp_matches_the_library_exp() {
        let mut x = 0.0f32;
        // The normal range; below it the result only has to be negligible.
        while x > -87.0 {
            let (a, b) = (exp_nonpositive(x), x.exp());
            assert!((a - b).abs() <= 1e-6 * b + 1e-38, "{x}: {a} vs {b}");
            x -= 0.0137;
        }
        for x in [-90.0f32, -200.0, -1e30] {
            assert!(exp_nonpositive(x) < 1e-36, "{x}");
        }
    }

    #[test]
    fn clamped_exp_and_silu_match_the_library() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_clamped(x), x.exp());
            assert!((a - b).abs() <= 1e-6 * b, "{x}: {a} vs {b}");
            let want = x / (1.0 + (-x).exp());
            assert!(
                (silu(x) - want).abs() <= 1e-6 * want.abs() + 1e-30,
                "silu {x}"
            );
            x += 0.0731;
        }
        assert!(exp_clamped(1000.0).is_finite());
        assert!(silu(-1000.0).abs() < 1e-30);
        assert_eq!(silu(1000.0), 1000.0);
    }
}
