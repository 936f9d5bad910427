//! Block formats. Scales are kept as f32 in memory (converted once, exactly, from the
//! file's f16) so the hot loops never convert half floats.

use half::f16;

/// Elements per block of every format here.
pub const QK: usize = 32;

/// GGML Q4_1: 32 weights `d * q + m`, `q` in 0..16, two per byte (low nibble = first
/// half of the block, high nibble = second half).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f32,
    pub m: f32,
    pub qs: [u8; QK / 2],
}

/// GGML Q8_0: 32 values `d * q`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f32,
    pub qs: [i8; QK],
}

/// GGML Q8_1 (activations for Q4_1): `d * q`, and `s = d * sum(q)` rounded to f16.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; QK],
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        Self {
            d: 0.0,
            s: 0.0,
            qs: [0; QK],
        }
    }
}

impl Default for BlockQ8_0 {
    fn default() -> Self {
        Self {
            d: 0.0,
            qs: [0; QK],
        }
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

impl BlockQ4_1 {
    /// Bytes per block in a GGUF file.
    pub const FILE_BYTES: usize = 4 + QK / 2;

    /// Parses GGUF bytes (a whole number of blocks).
    pub fn parse(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(Self::FILE_BYTES)
            .map(|b| {
                let mut qs = [0u8; QK / 2];
                qs.copy_from_slice(&b[4..]);
                Self {
                    d: f16_at(b, 0),
                    m: f16_at(b, 2),
                    qs,
                }
            })
            .collect()
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        for j in 0..QK / 2 {
            out[j] = self.d * f32::from(self.qs[j] & 0x0F) + self.m;
            out[j + QK / 2] = self.d * f32::from(self.qs[j] >> 4) + self.m;
        }
    }
}

impl BlockQ8_0 {
    pub const FILE_BYTES: usize = 2 + QK;

    pub fn parse(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(Self::FILE_BYTES)
            .map(|b| {
                let mut qs = [0i8; QK];
                for (q, &byte) in qs.iter_mut().zip(&b[2..]) {
                    *q = byte as i8;
                }
                Self {
                    d: f16_at(b, 0),
                    qs,
                }
            })
            .collect()
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        for (o, q) in out.iter_mut().zip(&self.qs) {
            *o = self.d * f32::from(*q);
        }
    }
}
