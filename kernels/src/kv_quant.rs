//! The element types of the paged KV cache and how values become them and back: one
//! definition for the CPU attention, the CUDA kernels' host references and (mirrored bit
//! for bit in `cuda/common.cuh`) the CUDA kernels.
//!
//! - `f32`, `bf16`, `f16`: the value itself (bf16 and f16 rounded to nearest even; f16
//!   saturates at ±65504 instead of overflowing to infinity).
//! - `fp8_e4m3`: OCP FP8 E4M3 (4 exponent bits, bias 7, 3 mantissa bits, no infinities;
//!   ±448 at most) of the value divided by a scale per layer and KV head, rounded to
//!   nearest even and saturating at ±448. The scale is fixed once, by the first write of
//!   each layer (a warm-up step at load), to [`FP8_HEADROOM`] times the largest value
//!   seen over 448: a scale shared by every block of a layer cannot change later without
//!   rewriting every block written with it.
//! - `int8`: the value over a scale per block and KV head, rounded to nearest even and
//!   clamped to ±127. A block's scale is set by the writes into it ([`Int8Run`]): each
//!   step's tokens that land in one block are one run, and a run whose largest value the
//!   scale cannot hold raises the scale and requantizes the block's earlier entries.
//!
//! Decoding is integer arithmetic and one multiply, with no table and no subnormal `f32`
//! operand, so the CPU attention's loops over a block vectorize.

/// Element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvCacheDtype {
    F32,
    Bf16,
    F16,
    Fp8E4m3,
    Int8,
}

/// Where a cache's scales live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleKind {
    /// None: values are stored as they are.
    None,
    /// One per layer and KV head, for K and for V (fp8).
    PerHead,
    /// One per block and KV head, for K and for V, in every layer (int8).
    PerBlockHead,
}

impl KvCacheDtype {
    /// Bytes of one stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvCacheDtype::F32 => 4,
            KvCacheDtype::Bf16 | KvCacheDtype::F16 => 2,
            KvCacheDtype::Fp8E4m3 | KvCacheDtype::Int8 => 1,
        }
    }

    pub fn scales(self) -> ScaleKind {
        match self {
            KvCacheDtype::Fp8E4m3 => ScaleKind::PerHead,
            KvCacheDtype::Int8 => ScaleKind::PerBlockHead,
            _ => ScaleKind::None,
        }
    }

    /// The name `--kv-cache-dtype` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::F32 => "f32",
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::F16 => "fp16",
            KvCacheDtype::Fp8E4m3 => "fp8_e4m3",
            KvCacheDtype::Int8 => "int8",
        }
    }

    /// Bytes one block of `block_size` positions takes per layer and KV head, K and V
    /// together, scales included (a per-head scale is not per block and not counted).
    pub fn block_bytes_per_head(self, block_size: usize, head_dim: usize) -> usize {
        let scales = match self.scales() {
            ScaleKind::PerBlockHead => std::mem::size_of::<f32>(),
            _ => 0,
        };
        2 * (block_size * head_dim * self.bytes() + scales)
    }
}

impl std::fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The largest E4M3 value.
pub const FP8_E4M3_MAX: f32 = 448.0;
/// How far above the largest value of the calibration write a layer's fp8 scale leaves
/// room: values up to this many times larger are stored unclipped. Floating point keeps
/// its relative precision however far below the top a value is (down to 2^-6 of 448 ×
/// scale, where E4M3 turns subnormal), so the room costs no precision for the values
/// that matter.
pub const FP8_HEADROOM: f32 = 8.0;
/// The smallest scale, for a head whose calibration saw only zeros.
pub const MIN_SCALE: f32 = 1e-12;
/// The largest int8 magnitude (symmetric: -128 is never stored).
pub const INT8_MAX: f32 = 127.0;

/// A stored KV value: how it decodes to `f32` before its scale is applied.
pub trait KvElement: Copy + Default + Send + Sync + 'static {
    const DTYPE: KvCacheDtype;
    /// The value, before the scale (for unscaled types, the value itself).
    fn decode(self) -> f32;
    /// `x` (already divided by its scale) stored as this type.
    fn encode(x: f32) -> Self;
    /// The slice as `f32`s when it is one, so readers can skip decoding.
    fn as_f32(values: &[Self]) -> Option<&[f32]> {
        let _ = values;
        None
    }
}

impl KvElement for f32 {
    const DTYPE: KvCacheDtype = KvCacheDtype::F32;
    #[inline(always)]
    fn decode(self) -> f32 {
        self
    }
    fn encode(x: f32) -> Self {
        x
    }
    fn as_f32(values: &[Self]) -> Option<&[f32]> {
        Some(values)
    }
}

impl KvElement for half::bf16 {
    const DTYPE: KvCacheDtype = KvCacheDtype::Bf16;
    #[inline(always)]
    fn decode(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    fn encode(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

impl KvElement for half::f16 {
    const DTYPE: KvCacheDtype = KvCacheDtype::F16;
    #[inline(always)]
    fn decode(self) -> f32 {
        f16_to_f32(self.to_bits())
    }
    fn encode(x: f32) -> Self {
        half::f16::from_f32(x.clamp(-65504.0, 65504.0))
    }
}

/// An OCP FP8 E4M3 value, by its bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct E4m3(pub u8);

impl KvElement for E4m3 {
    const DTYPE: KvCacheDtype = KvCacheDtype::Fp8E4m3;
    #[inline(always)]
    fn decode(self) -> f32 {
        e4m3_to_f32(self.0)
    }
    fn encode(x: f32) -> Self {
        E4m3(e4m3_from_f32(x))
    }
}

impl KvElement for i8 {
    const DTYPE: KvCacheDtype = KvCacheDtype::Int8;
    #[inline(always)]
    fn decode(self) -> f32 {
        f32::from(self)
    }
    /// Rounded half to even after the clamp (±127 are whole, so clamping first changes
    /// nothing and keeps the rounding exact), without a libm call; NaN stores 0.
    #[inline(always)]
    fn encode(x: f32) -> Self {
        if x.is_nan() {
            return 0;
        }
        crate::round::round_even_i32(x.clamp(-INT8_MAX, INT8_MAX)) as i8
    }
}

/// `dst[i] = src[i] · scale`, decoded.
#[inline(always)]
pub fn decode_into<T: KvElement>(src: &[T], scale: f32, dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.decode() * scale;
    }
}

/// An E4M3 byte as `f32`: its exponent and mantissa bits put where `f32` keeps them make
/// an `f32` 2^120 smaller than the value (a normal number a normal one, a subnormal one a
/// subnormal one), which one multiplication by 2^120 makes exact; then the sign. No
/// branches, so a loop over a block vectorizes. 0x7f and 0xff (E4M3's NaN) are never
/// stored ([`e4m3_from_f32`] saturates) and read as ±480.
#[inline(always)]
pub fn e4m3_to_f32(b: u8) -> f32 {
    const TWO_POW_120: f32 = f32::from_bits((120 + 127) << 23);
    let b = u32::from(b);
    let magnitude = f32::from_bits((b & 0x7f) << 20) * TWO_POW_120;
    f32::from_bits(magnitude.to_bits() | ((b & 0x80) << 24))
}

/// `x` as E4M3, rounded to nearest even, saturating at ±448 (NaN too).
pub fn e4m3_from_f32(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    // 464 is halfway between 448 and 480 (which would be the NaN code) and rounds to
    // even, 448; anything from it up saturates.
    if a.is_nan() || a >= 464.0 {
        return sign | 0x7e;
    }
    if a < 0.015625 {
        // Subnormal: whole units of 2^-9 (8 units is the smallest normal, 0x08).
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let bits = a.to_bits();
    // Round the mantissa to its top 3 bits, to nearest even; a carry moves the exponent.
    let r = bits + 0x7_ffff + ((bits >> 20) & 1);
    let e = (r >> 23) as i32 - 127 + 7;
    sign | ((e as u8) << 3) | ((r >> 20) & 7) as u8
}

/// An IEEE half's bits as `f32`, as [`e4m3_to_f32`] does it: exponent and mantissa moved
/// into place, scaled by 2^112 (no infinities are stored).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    const TWO_POW_112: f32 = f32::from_bits((112 + 127) << 23);
    let h = u32::from(h);
    let magnitude = f32::from_bits((h & 0x7fff) << 13) * TWO_POW_112;
    f32::from_bits(magnitude.to_bits() | ((h & 0x8000) << 16))
}

/// A layer's fp8 scale for a head whose calibration write's largest magnitude was
/// `amax`.
pub fn fp8_scale(amax: f32) -> f32 {
    (amax * FP8_HEADROOM / FP8_E4M3_MAX).max(MIN_SCALE)
}

/// One run of an int8 write: the tokens of one step that land in one block, for one KV
/// head, from position `start` of the block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8Run {
    /// The block's scale before the run; ignored when the run starts the block.
    pub old_scale: f32,
    /// The run's first position in the block. 0: the block is fresh (its earlier
    /// content, if any, belonged to another sequence), so its scale starts anew.
    pub start: usize,
    /// The largest magnitude among the run's values.
    pub amax: f32,
}

impl Int8Run {
    /// The block's scale after the run: large enough for the run, never smaller than
    /// before (entries already written keep fitting).
    pub fn scale(&self) -> f32 {
        let base = if self.start == 0 { 0.0 } else { self.old_scale };
        base.max(self.amax / INT8_MAX)
    }

    /// Whether the block's entries before `start` must be requantized to the new scale.
    pub fn rescales(&self) -> bool {
        self.start > 0 && self.scale() > self.old_scale
    }
}

/// `x` stored under `scale` (0 when the scale is 0: the block holds only zeros).
#[inline(always)]
pub fn int8_quantize(x: f32, scale: f32) -> i8 {
    if scale > 0.0 {
        i8::encode(x / scale)
    } else {
        0
    }
}

/// An entry stored under `old` stored again under `new`.
#[inline(always)]
pub fn int8_requantize(q: i8, old: f32, new: f32) -> i8 {
    int8_quantize(f32::from(q) * old, new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e4m3_code_decodes_to_its_value_and_back() {
        for b in 0u8..=255 {
            if b & 0x7f == 0x7f {
                continue; // NaN codes: never written.
            }
            let e = i32::from((b >> 3) & 0xf);
            let m = f32::from(b & 7);
            let magnitude = if e == 0 {
                m / 8.0 * 2f32.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f32.powi(e - 7)
            };
            let want = if b & 0x80 != 0 { -magnitude } else { magnitude };
            assert_eq!(e4m3_to_f32(b), want, "code {b:#04x}");
            // -0 encodes as 0x80, which decodes to -0: the round trip holds bitwise.
            assert_eq!(e4m3_from_f32(want), b, "code {b:#04x} from {want}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e4m3_rounds_to_the_nearest_code_ties_to_even_and_saturates() {
        let codes: Vec<f32> = (0u8..0x7f).map(e4m3_to_f32).collect();
        let mut x = 1e-4f32;
        while x < 600.0 {
            for v in [x, -x] {
                let got = e4m3_to_f32(e4m3_from_f32(v));
                let a = v.abs().min(448.0);
                let best = codes
                    .iter()
                    .map(|c| (c - a).abs())
                    .fold(f32::INFINITY, f32::min);
                assert!(
                    ((got.abs() - a).abs() - best).abs() <= best * 1e-6,
                    "{v}: {got}"
                );
                assert_eq!(got.is_sign_negative(), v < 0.0);
            }
            x *= 1.0137;
        }
        // Ties: 1 + 1/16 lies between 1 and 1.125 and goes to 1 (even mantissa 0);
        // 1 + 3/16 to 1.25 (mantissa 2).
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.1875)), 1.25);
        assert_eq!(e4m3_from_f32(463.9), 0x7e);
        assert_eq!(e4m3_from_f32(1e9), 0x7e);
        assert_eq!(e4m3_from_f32(-f32::INFINITY), 0xfe);
        assert_eq!(e4m3_from_f32(f32::NAN) & 0x7f, 0x7e);
    }

    #[test]
    fn int8_rounds_half_to_even_and_saturates() {
        let mut x = -200.0f32;
        while x <= 200.0 {
            let want = x.round_ties_even().clamp(-127.0, 127.0) as i8;
            assert_eq!(i8::encode(x), want, "{x}");
            x += 0.125;
        }
        assert_eq!(i8::encode(2.5), 2);
        assert_eq!(i8::encode(-3.5), -4);
        assert_eq!(i8::encode(1e30), 127);
        assert_eq!(i8::encode(f32::NAN), 0);
    }

    #[test]
    fn f16_decodes_as_half_does() {
        for h in 0u16..=0xffff {
            if (h >> 10) & 0x1f == 0x1f {
                continue; // Infinities and NaNs: never written.
            }
            assert_eq!(
                f16_to_f32(h).to_bits(),
                half::f16::from_bits(h).to_f32().to_bits(),
                "{h:#06x}"
            );
        }
        assert_eq!(half::f16::encode(1e6).to_f32(), 65504.0);
    }

    #[test]
    fn bf16_decodes_by_its_bits() {
        for x in [0.0f32, -1.5, 3.140625, 1e-30, -6e20] {
            let b = half::bf16::encode(x);
            assert_eq!(b.decode(), b.to_f32());
        }
    }

    #[test]
    fn an_int8_block_scale_only_grows_and_a_fresh_block_starts_anew() {
        let run = Int8Run {
            old_scale: 0.5,
            start: 3,
            amax: 127.0,
        };
        assert_eq!(run.scale(), 1.0);
        assert!(run.rescales());
        let small = Int8Run { amax: 1.0, ..run };
        assert_eq!(small.scale(), 0.5);
        assert!(!small.rescales());
        let fresh = Int8Run { start: 0, ..small };
        assert_eq!(fresh.scale(), 1.0 / 127.0);
        assert!(!fresh.rescales());
        assert_eq!(int8_quantize(0.3, 0.0), 0);
        assert_eq!(int8_quantize(-1000.0, 1.0), -127);
        assert_eq!(int8_quantize(2.5, 1.0), 2, "ties to even");
        assert_eq!(int8_requantize(100, 0.5, 1.0), 50);
    }

    #[test]
    fn block_bytes_count_the_int8_scales() {
        assert_eq!(KvCacheDtype::Bf16.block_bytes_per_head(16, 64), 4096);
        assert_eq!(KvCacheDtype::Fp8E4m3.block_bytes_per_head(16, 64), 2048);
        assert_eq!(KvCacheDtype::Int8.block_bytes_per_head(16, 64), 2056);
        assert_eq!(KvCacheDtype::F32.block_bytes_per_head(16, 64), 8192);
    }
}
